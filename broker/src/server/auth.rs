//! The authentication and authorization hook of the request path.
//!
//! Every connection authenticates once, in its `Hello` (the optional
//! token), and every request that touches a topic asks
//! [`Authorizer::allow`] first. The default, [`AllowAll`], lets everyone
//! do everything (a broker on loopback); a deployment plugs in its own.

/// Who a connection authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// A name for logs (never the credential itself).
    pub name: String,
}

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access<'a> {
    /// Read a topic (fetch, group join and poll).
    Read(&'a str),
    /// Write a topic (produce).
    Write(&'a str),
    /// Change or inspect the topology (create, split, merge, hot keys,
    /// describe, groups, stats); the topic when there is one.
    Admin(Option<&'a str>),
}

/// Decides who may connect and what they may do.
pub trait Authorizer: Send + Sync + 'static {
    /// The principal a `Hello`'s token authenticates, `None` to refuse
    /// the connection.
    fn authenticate(&self, token: Option<&[u8]>) -> Option<Principal>;
    /// Whether `who` may do `access`.
    fn allow(&self, who: &Principal, access: Access<'_>) -> bool;
}

/// Everyone may do everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Authorizer for AllowAll {
    fn authenticate(&self, _token: Option<&[u8]>) -> Option<Principal> {
        Some(Principal {
            name: "anonymous".into(),
        })
    }

    fn allow(&self, _who: &Principal, _access: Access<'_>) -> bool {
        true
    }
}

/// What one token may do.
#[derive(Clone, Default, serde::Deserialize)]
pub struct Grant {
    /// The principal's name (in logs; never the token).
    pub name: String,
    /// The credential.
    pub token: String,
    /// Topics it may read (`"*"`: every topic).
    #[serde(default)]
    pub read: Vec<String>,
    /// Topics it may write (`"*"`: every topic).
    #[serde(default)]
    pub write: Vec<String>,
    /// May create topics, change the topology and inspect groups.
    #[serde(default)]
    pub admin: bool,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("read", &self.read)
            .field("write", &self.write)
            .field("admin", &self.admin)
            .finish()
    }
}

/// Tokens with per-topic read and write permissions. Tokens are compared
/// in constant time (every grant is compared, each over its whole
/// length), and neither `Debug` nor any log line shows one.
#[derive(Debug, Clone, Default)]
pub struct TokenAuthorizer {
    grants: Vec<Grant>,
}

/// The file `serve --auth-file` reads: `{"tokens": [Grant...]}`.
#[derive(serde::Deserialize)]
struct AuthFile {
    tokens: Vec<Grant>,
}

impl TokenAuthorizer {
    /// No tokens: every connection is refused.
    pub fn new() -> TokenAuthorizer {
        TokenAuthorizer::default()
    }

    /// Adds a token. A grant under a name already granted replaces the
    /// earlier one: permissions are looked up by the principal's name, so
    /// two grants under one name would lend one token the other's.
    pub fn grant(mut self, g: Grant) -> TokenAuthorizer {
        self.grants.retain(|old| old.name != g.name);
        self.grants.push(g);
        self
    }

    /// Parses `{"tokens": [{"name", "token", "read": [..], "write": [..], "admin"}]}`.
    pub fn from_json(text: &str) -> Result<TokenAuthorizer, String> {
        let f: AuthFile = serde_json::from_str(text).map_err(|e| format!("bad auth file: {e}"))?;
        if f.tokens.iter().any(|g| g.token.is_empty()) {
            return Err("bad auth file: an empty token".into());
        }
        let mut names = std::collections::HashSet::new();
        if let Some(g) = f.tokens.iter().find(|g| !names.insert(g.name.as_str())) {
            return Err(format!(
                "bad auth file: two grants are named {:?} (permissions are the name's, so each grant needs its own)",
                g.name
            ));
        }
        Ok(TokenAuthorizer { grants: f.tokens })
    }

    fn grant_of(&self, who: &Principal) -> Option<&Grant> {
        self.grants.iter().find(|g| g.name == who.name)
    }
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    // Keep the optimiser from turning the loop into an early exit.
    std::hint::black_box(diff) == 0
}

fn covers(list: &[String], topic: &str) -> bool {
    list.iter().any(|t| t == "*" || t == topic)
}

impl Authorizer for TokenAuthorizer {
    fn authenticate(&self, token: Option<&[u8]>) -> Option<Principal> {
        let token = token?;
        let mut found: Option<&Grant> = None;
        for g in &self.grants {
            // Every grant is compared, match or not.
            if constant_time_eq(g.token.as_bytes(), token) && found.is_none() {
                found = Some(g);
            }
        }
        found.map(|g| Principal {
            name: g.name.clone(),
        })
    }

    fn allow(&self, who: &Principal, access: Access<'_>) -> bool {
        let Some(g) = self.grant_of(who) else {
            return false;
        };
        match access {
            Access::Read(t) => covers(&g.read, t),
            Access::Write(t) => covers(&g.write, t),
            Access::Admin(_) => g.admin,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_tells_equal_from_different_and_prefixes() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn an_auth_file_with_two_grants_under_one_name_is_refused_naming_it() {
        let text = r#"{"tokens": [
            {"name": "svc", "token": "a", "admin": true},
            {"name": "svc", "token": "b", "read": ["audit"]}
        ]}"#;
        let e = TokenAuthorizer::from_json(text).unwrap_err();
        assert!(e.contains("\"svc\""), "{e}");
        let ok = r#"{"tokens": [{"name": "svc", "token": "a"}, {"name": "ops", "token": "b"}]}"#;
        assert!(TokenAuthorizer::from_json(ok).is_ok());
    }

    #[test]
    fn a_grant_never_shows_its_token_in_debug_output() {
        let a = TokenAuthorizer::new().grant(Grant {
            name: "alice".into(),
            token: "s3cr3t-token".into(),
            ..Default::default()
        });
        assert!(!format!("{a:?}").contains("s3cr3t"));
    }
}
