//! Topic name validation: a name becomes part of a path, so anything that
//! could escape the log directory is rejected before the filesystem is touched.

use crate::error::{Error, Result};

/// Longest topic name.
pub const MAX_TOPIC_NAME: usize = 249;

/// Accepts 1–249 characters of `[A-Za-z0-9._-]`, except `.` and `..`.
pub fn validate(name: &str) -> Result<()> {
    let bad = |reason| {
        Err(Error::InvalidTopicName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_TOPIC_NAME {
        return bad("longer than 249 characters");
    }
    if name == "." || name == ".." {
        return bad("'.' and '..' are reserved");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return bad("only A-Z, a-z, 0-9, '.', '_' and '-' are allowed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "orders", "a.b_c-D9", &"x".repeat(249), "..."] {
            assert!(validate(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "a b",
            &"x".repeat(250),
            "é",
            "a\0b",
        ] {
            assert!(
                matches!(validate(bad), Err(Error::InvalidTopicName { .. })),
                "{bad}"
            );
        }
    }
}
