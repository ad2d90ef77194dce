//! The protocol over TLS: a round trip with a certificate made here, the
//! token still checked inside the tunnel, and the clients that must be
//! refused (plaintext, an untrusted certificate, a wrong name, no client
//! certificate under mutual TLS) refused quickly rather than left hanging.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::TestServer;
use fissionlog_broker::client::{
    Admin, ClientError, Connection, Consumer, ConsumerConfig, Producer, ProducerConfig,
};
use fissionlog_broker::protocol::{ErrorCode, SyncSpec};
use fissionlog_broker::server::{Grant, ServerConfig, TokenAuthorizer};
use fissionlog_broker::tls::{self, ClientTls};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// How long any refused client may take to learn it was refused.
const REFUSAL_BOUND: Duration = Duration::from_secs(5);

/// A CA and a leaf it signed for `localhost` and 127.0.0.1.
struct Pki {
    ca: CertificateDer<'static>,
    ca_cert: rcgen::Certificate,
    ca_key: KeyPair,
    leaf: CertificateDer<'static>,
    leaf_key: PrivateKeyDer<'static>,
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    (params.self_signed(&key).unwrap(), key)
}

fn leaf_signed_by(
    ca: &rcgen::Certificate,
    ca_key: &KeyPair,
    names: &[&str],
) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    let params =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca, ca_key).unwrap();
    (
        cert.der().clone(),
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
}

fn pki() -> Pki {
    let (ca_cert, ca_key) = ca("fissionlog test CA");
    let (leaf, leaf_key) = leaf_signed_by(&ca_cert, &ca_key, &["localhost", "127.0.0.1"]);
    Pki {
        ca: ca_cert.der().clone(),
        ca_cert,
        ca_key,
        leaf,
        leaf_key,
    }
}

fn tok(s: &'static str) -> Option<Bytes> {
    Some(Bytes::from_static(s.as_bytes()))
}

async fn tls_server(p: &Pki, client_cas: Option<Vec<CertificateDer<'static>>>) -> TestServer {
    let auth = TokenAuthorizer::new().grant(Grant {
        name: "app".into(),
        token: "app-token".into(),
        read: vec!["*".into()],
        write: vec!["*".into()],
        admin: true,
    });
    let tls =
        tls::server_config_from_der(vec![p.leaf.clone()], p.leaf_key.clone_key(), client_cas)
            .unwrap();
    TestServer::start(ServerConfig {
        authorizer: Arc::new(auth),
        tls: Some(tls),
        tls_handshake_timeout: Duration::from_secs(2),
        ..Default::default()
    })
    .await
}

fn trusting(ca: &CertificateDer<'static>, name: &str) -> ClientTls {
    ClientTls::from_roots(tls::roots_of(vec![ca.clone()]).unwrap(), name, None).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_produced_over_tls_are_consumed_over_tls_with_the_token_checked() {
    let p = pki();
    let srv = tls_server(&p, None).await;
    let client = trusting(&p.ca, "localhost");

    // The token is still required inside the tunnel.
    let e = Connection::connect_tls(srv.addr, &client, tok("wrong-token"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthorized), "{e}");

    let conn = Connection::connect_tls(srv.addr, &client, tok("app-token"))
        .await
        .unwrap();
    Admin::new(conn.clone())
        .create_topic("secure", 2, SyncSpec::Never, 0, false)
        .await
        .unwrap();
    let producer = Producer::new(conn.clone(), ProducerConfig::new("secure"));
    let mut acks = Vec::new();
    for i in 0..50u32 {
        let key = Bytes::from(format!("k{}", i % 5));
        acks.push(producer.send(Some(key), Bytes::from(format!("v{i}"))).await);
    }
    for a in acks {
        a.await.unwrap();
    }
    let mut consumer = Consumer::join(conn, ConsumerConfig::new("secure", "g"))
        .await
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.len() < 50 && tokio::time::Instant::now() < deadline {
        for r in consumer
            .poll(100, Duration::from_millis(200))
            .await
            .unwrap()
        {
            seen.insert(r.value.to_vec());
        }
    }
    assert_eq!(seen.len(), 50, "every record came back over TLS");
    consumer.commit().await.unwrap();
    assert!(srv.stats.snapshot().records_produced >= 50);
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_client_against_a_tls_listener_gets_a_clean_error_not_a_hang() {
    let p = pki();
    let srv = tls_server(&p, None).await;
    let r = tokio::time::timeout(
        REFUSAL_BOUND,
        Connection::connect(srv.addr, tok("app-token")),
    )
    .await
    .expect("the plaintext client is answered within the bound");
    let e = r.unwrap_err();
    assert!(
        matches!(e, ClientError::Disconnected(_) | ClientError::Protocol(_)),
        "a closed connection or an unparsable answer, got {e:?}"
    );
    assert!(srv.stats.snapshot().tls_handshakes_failed >= 1);
    assert_eq!(srv.stats.snapshot().requests, 0, "no request was read");
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_trust_the_servers_certificate_is_refused() {
    let p = pki();
    let srv = tls_server(&p, None).await;
    let (other_ca, _) = ca("another CA");
    let distrusting = trusting(&other_ca.der().clone(), "localhost");
    let e = tokio::time::timeout(
        REFUSAL_BOUND,
        Connection::connect_tls(srv.addr, &distrusting, tok("app-token")),
    )
    .await
    .expect("refused within the bound")
    .unwrap_err();
    assert!(matches!(e, ClientError::Tls(_)), "got {e:?}");

    // Trusted CA, but the certificate doesn't name the server asked for.
    let wrong_name = trusting(&p.ca, "broker.example");
    let e = tokio::time::timeout(
        REFUSAL_BOUND,
        Connection::connect_tls(srv.addr, &wrong_name, tok("app-token")),
    )
    .await
    .expect("refused within the bound")
    .unwrap_err();
    assert!(matches!(e, ClientError::Tls(_)), "got {e:?}");
    srv.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_mutual_tls_only_a_client_with_a_certificate_from_the_client_ca_gets_in() {
    let p = pki();
    let (client_ca, client_ca_key) = ca("client CA");
    let srv = tls_server(&p, Some(vec![client_ca.der().clone()])).await;

    let anonymous = trusting(&p.ca, "localhost");
    let r = tokio::time::timeout(
        REFUSAL_BOUND,
        Connection::connect_tls(srv.addr, &anonymous, tok("app-token")),
    )
    .await
    .expect("refused within the bound");
    assert!(r.is_err(), "a client without a certificate is refused");

    // A certificate signed by the server's CA, not the client CA.
    let (wrong_cert, wrong_key) = leaf_signed_by(&p.ca_cert, &p.ca_key, &["client"]);
    let wrong = ClientTls::from_roots(
        tls::roots_of(vec![p.ca.clone()]).unwrap(),
        "localhost",
        Some((vec![wrong_cert], wrong_key)),
    )
    .unwrap();
    let r = tokio::time::timeout(
        REFUSAL_BOUND,
        Connection::connect_tls(srv.addr, &wrong, tok("app-token")),
    )
    .await
    .expect("refused within the bound");
    assert!(r.is_err(), "a certificate of another CA is refused");

    let (cert, key) = leaf_signed_by(&client_ca, &client_ca_key, &["client"]);
    let good = ClientTls::from_roots(
        tls::roots_of(vec![p.ca.clone()]).unwrap(),
        "localhost",
        Some((vec![cert], key)),
    )
    .unwrap();
    let conn = Connection::connect_tls(srv.addr, &good, tok("app-token"))
        .await
        .unwrap();
    Admin::new(conn).list_topics().await.unwrap();
    srv.stop().await.unwrap();
}

#[test]
fn pem_files_load_into_a_server_configuration_and_a_missing_file_is_named() {
    let p = pki();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    let ca_pem = dir.path().join("ca.pem");
    std::fs::write(&cert, p.ca_cert.pem()).unwrap();
    std::fs::write(&ca_pem, p.ca_cert.pem()).unwrap();
    std::fs::write(&key, p.ca_key.serialize_pem()).unwrap();
    tls::server_config(&cert, &key, Some(&ca_pem)).unwrap();
    ClientTls::from_ca_file(&ca_pem, "localhost").unwrap();
    let missing = dir.path().join("absent.pem");
    let e = tls::server_config(&missing, &key, None).unwrap_err();
    assert!(e.to_string().contains("absent.pem"), "{e}");
    let e = tls::server_config(&key, &key, None).unwrap_err();
    assert!(e.to_string().contains("key.pem"), "{e}");
}
