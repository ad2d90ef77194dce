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
    let tls = tls::server_config_from_der(vec![p.leaf.clone()], p.leaf_key.clone_key(), client_cas)
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
    // The server counts the failure once its side of the handshake ends,
    // which may be just after the client saw the alert.
    let deadline = tokio::time::Instant::now() + REFUSAL_BOUND;
    while srv.stats.snapshot().tls_handshakes_failed == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failed handshake is counted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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

/// A broker process; killed when dropped.
struct BrokerProcess(std::process::Child);

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_cli_serves_tls_and_http_and_its_client_commands_connect_with_a_ca_file() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Command, Stdio};
    const BIN: &str = env!("CARGO_BIN_EXE_fissionlog-broker");
    let p = pki();
    let dir = tempfile::tempdir().unwrap();
    let write_pem = |name: &str, label: &str, der: &[u8]| {
        let path = dir.path().join(name);
        let pem = pem_encode(label, der);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let cert = write_pem("cert.pem", "CERTIFICATE", &p.leaf);
    let key = write_pem("key.pem", "PRIVATE KEY", p.leaf_key.secret_der());
    let ca_pem = write_pem("ca.pem", "CERTIFICATE", &p.ca);
    let data = dir.path().join("data");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .arg("--dir")
        .arg(&data)
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let broker = BrokerProcess(child);
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect("the address line")
        .to_string();
    line.clear();
    out.read_line(&mut line).unwrap();
    let http = line
        .trim()
        .strip_prefix("http on http://")
        .and_then(|h| h.strip_suffix('/'))
        .expect("the HTTP line")
        .to_string();

    let run = |args: &[&str], stdin: &str| {
        let mut c = Command::new(BIN)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while c.try_wait().unwrap().is_none() {
            assert!(std::time::Instant::now() < deadline, "{args:?} hung");
            std::thread::sleep(Duration::from_millis(10));
        }
        c.wait_with_output().unwrap()
    };
    let ca = ca_pem.to_str().unwrap();
    let o = run(
        &[
            "produce", "--server", &addr, "--tls-ca", ca, "--topic", "t", "--create",
        ],
        "k\tv\n",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(
        &[
            "groups",
            "--server",
            &addr,
            "--tls-ca",
            ca,
            "--tls-server-name",
            "localhost",
        ],
        "",
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["groups", "--server", &addr], "");
    assert_eq!(
        o.status.code(),
        Some(2),
        "plaintext against TLS: unreachable"
    );

    let mut s = std::net::TcpStream::connect(&http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("fissionlog_broker_records_produced_total 1"),
        "{text}"
    );
    drop(broker);
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::new();
    for chunk in der.chunks(3) {
        let n = chunk.len();
        let v = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= n {
                b64.push(ALPHABET[((v >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_that_stalls_mid_handshake_is_closed_and_frees_its_slot() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = pki();
    let auth = TokenAuthorizer::new().grant(Grant {
        name: "app".into(),
        token: "app-token".into(),
        read: vec!["*".into()],
        write: vec!["*".into()],
        admin: true,
    });
    let tls =
        tls::server_config_from_der(vec![p.leaf.clone()], p.leaf_key.clone_key(), None).unwrap();
    let srv = TestServer::start(ServerConfig {
        authorizer: Arc::new(auth),
        tls: Some(tls),
        tls_handshake_timeout: Duration::from_millis(300),
        max_connections: 1,
        ..Default::default()
    })
    .await;
    // The start of a ClientHello record, then nothing.
    let mut s = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(REFUSAL_BOUND, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a stalled TLS handshake is held open");
    let conn = Connection::connect_tls(srv.addr, &trusting(&p.ca, "localhost"), tok("app-token"))
        .await
        .expect("the slot was freed");
    Admin::new(conn).list_topics().await.unwrap();
    assert!(srv.stats.snapshot().tls_handshakes_failed >= 1);
    srv.stop().await.unwrap();
}
