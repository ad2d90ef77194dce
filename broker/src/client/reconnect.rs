//! Connecting again after a lost connection: where the broker is
//! ([`Endpoint`]), how long to keep trying ([`Reconnect`]), and the
//! bounded backoff loop the producer runs.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::{ClientError, Connection};
use crate::protocol::ErrorCode;
use crate::tls::ClientTls;

/// How to reach a broker: its address (and, for a cluster, more brokers
/// to try when it can't be reached), TLS if it serves TLS, and the
/// token. A producer made with [`Producer::connect`](super::Producer::connect)
/// keeps it to connect again (and shake hands again, TLS and token
/// included) after its connection drops.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `host:port`.
    pub addr: String,
    /// Brokers tried in order when `addr` can't be reached (cluster
    /// mode: any broker names the partitions' leaders), so a producer
    /// whose only broker died goes on through another.
    pub bootstrap: Vec<String>,
    /// The server's TLS as the client checks it; `None` for plain TCP.
    pub tls: Option<ClientTls>,
    /// The `Hello`'s token.
    pub token: Option<Bytes>,
    /// The request timeout of each connection made
    /// ([`Connection::set_request_timeout`]); `None`: the default.
    pub request_timeout: Option<Duration>,
}

impl Endpoint {
    /// Plain TCP to `addr`, no token.
    pub fn new(addr: impl Into<String>) -> Endpoint {
        Endpoint {
            addr: addr.into(),
            bootstrap: Vec::new(),
            tls: None,
            token: None,
            request_timeout: None,
        }
    }

    /// The first of `addrs`, the others tried in order when it can't be
    /// reached. Empty: no address, every connect fails.
    pub fn with_bootstrap<S: Into<String>>(addrs: impl IntoIterator<Item = S>) -> Endpoint {
        let mut addrs = addrs.into_iter().map(Into::into);
        let mut e = Endpoint::new(addrs.next().unwrap_or_default());
        e.bootstrap = addrs.collect();
        e
    }

    /// The same endpoint over TLS.
    pub fn with_tls(mut self, tls: ClientTls) -> Endpoint {
        self.tls = Some(tls);
        self
    }

    /// The same endpoint with a token.
    pub fn with_token(mut self, token: Bytes) -> Endpoint {
        self.token = Some(token);
        self
    }

    /// The same endpoint, its connections waiting at most `timeout` for
    /// each response.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Endpoint {
        self.request_timeout = Some(timeout);
        self
    }

    /// Connects once: TCP, TLS when configured, the handshake; to `addr`,
    /// else to the first of `bootstrap` that answers. A refusal that is
    /// not a lost connection (a bad token) is not tried elsewhere.
    pub async fn connect(&self) -> Result<Connection, ClientError> {
        let mut result = self.connect_to(&self.addr).await;
        for addr in &self.bootstrap {
            match &result {
                Err(e) if is_lost(e) => {
                    tracing::debug!(failed = %self.addr, next = %addr, error = %e, "trying the next broker");
                    result = self.connect_to(addr).await;
                }
                _ => break,
            }
        }
        result
    }

    async fn connect_to(&self, addr: &str) -> Result<Connection, ClientError> {
        let conn = match &self.tls {
            Some(tls) => Connection::connect_tls(addr, tls, self.token.clone()).await?,
            None => Connection::connect(addr, self.token.clone()).await?,
        };
        if let Some(t) = self.request_timeout {
            conn.set_request_timeout(t);
        }
        Ok(conn)
    }
}

/// How a producer reconnects after its connection drops: it waits
/// `backoff_min`, doubling up to `backoff_max` between attempts, and gives
/// up once `deadline` has passed since the connection was lost; the
/// records waiting then fail with [`ClientError::Unavailable`].
#[derive(Clone, Debug)]
pub struct Reconnect {
    /// The first wait between attempts.
    pub backoff_min: Duration,
    /// The longest wait between attempts.
    pub backoff_max: Duration,
    /// How long after the loss attempts go on.
    pub deadline: Duration,
}

impl Default for Reconnect {
    /// 50 ms doubling up to 2 s, for at most 30 s.
    fn default() -> Reconnect {
        Reconnect {
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            deadline: Duration::from_secs(30),
        }
    }
}

/// Whether a call failed because the connection went (or the server is
/// going): nothing about the request itself, so it may be sent again on
/// a new connection.
pub(super) fn is_lost(e: &ClientError) -> bool {
    use std::io::ErrorKind;
    match e {
        ClientError::Disconnected(_) | ClientError::Connect(_) => true,
        // A TLS handshake cut off by the server going away; a certificate
        // that isn't trusted is `InvalidData` and won't change.
        ClientError::Tls(io) => matches!(
            io.kind(),
            ErrorKind::UnexpectedEof
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
        ),
        _ => e.code() == Some(ErrorCode::ShuttingDown),
    }
}

/// A copy of `e` for each record it fails (`ClientError` holds I/O
/// errors, which don't clone).
pub(super) fn copy_error(e: &ClientError) -> ClientError {
    match e {
        ClientError::Server { code, message } => ClientError::Server {
            code: *code,
            message: message.clone(),
        },
        ClientError::Unavailable {
            addr,
            attempts,
            waited,
            last_error,
        } => ClientError::Unavailable {
            addr: addr.clone(),
            attempts: *attempts,
            waited: *waited,
            last_error: last_error.clone(),
        },
        ClientError::NotLeader { message, leader } => ClientError::NotLeader {
            message: message.clone(),
            leader: leader.clone(),
        },
        other => ClientError::Disconnected(other.to_string()),
    }
}

/// Connects to `endpoint` and runs `ready` on the new connection (the
/// producer's topology fetch), attempt after attempt with the policy's
/// backoff, until one succeeds or `since + deadline` passes. A refusal
/// that another attempt won't change (a bad token, an unknown topic)
/// ends the attempts at once.
pub(super) async fn redial<T, F, Fut>(
    endpoint: &Endpoint,
    policy: &Reconnect,
    since: Instant,
    mut ready: F,
) -> Result<(Connection, T), ClientError>
where
    F: FnMut(Connection) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let mut backoff = policy.backoff_min.max(Duration::from_millis(1));
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let err = match endpoint.connect().await {
            Ok(conn) => match ready(conn.clone()).await {
                Ok(t) => return Ok((conn, t)),
                Err(e) => e,
            },
            Err(e) => e,
        };
        if !is_lost(&err) {
            return Err(err);
        }
        let waited = since.elapsed();
        if waited + backoff > policy.deadline {
            return Err(ClientError::Unavailable {
                addr: endpoint.addr.clone(),
                attempts,
                waited,
                last_error: err.to_string(),
            });
        }
        tracing::debug!(addr = %endpoint.addr, attempts, error = %err, "reconnecting");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(policy.backoff_max.max(backoff));
    }
}
