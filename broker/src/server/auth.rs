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
