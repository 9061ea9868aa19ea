//! A shared secret (PROTOCOL.md §15): the one clients present to the service, or the one the
//! service presents to its change source (§4).
//!
//! Why a type of its own: a secret must never be printed, so [`Secret`] has no way to show its
//! bytes. Its `Debug` and `Display` write `<redacted>`, so a configuration that holds one can be
//! logged or `{:?}`-printed whole; the bytes leave only as a header value
//! ([`Secret::bearer_header`]) or through a comparison in constant time ([`Secret::matches`]).
//!
//! [`Secrets`] are the one or two secrets clients may present while one is rotated (PROTOCOL.md
//! §15.1): read from one or two files, or two lines of one.

use std::fmt;
use std::path::Path;

use subtle::ConstantTimeEq;

/// Shortest accepted secret, in bytes: shorter ones can be guessed.
pub const MIN_SECRET_BYTES: usize = 16;
/// Longest accepted secret, in bytes: it travels in one header line.
pub const MAX_SECRET_BYTES: usize = 4096;

/// A secret of [`MIN_SECRET_BYTES`] to [`MAX_SECRET_BYTES`] visible ASCII bytes.
#[derive(Clone)]
pub struct Secret(Box<[u8]>);

/// Why a secret was refused. None of them carries any of its bytes.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("the secret is {0} bytes; it must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES}")]
    Length(usize),
    #[error(
        "the secret holds a byte that a header cannot carry (at {0}): use visible ASCII only, \
         no spaces (e.g. `openssl rand -hex 32`)"
    )]
    Byte(usize),
    #[error("cannot read {path}: {reason}")]
    File { path: String, reason: String },
    #[error("{0} secrets given; at most {MAX_SECRETS} (the current one and the next)")]
    TooMany(usize),
    #[error("line {line} of {path}: {source}")]
    Line {
        path: String,
        line: usize,
        source: Box<SecretError>,
    },
}

impl Secret {
    /// Checks `bytes` against the rules above.
    ///
    /// Why visible ASCII only: the secret is sent as `Authorization: Bearer <secret>`, and a
    /// header value cannot hold control bytes, and loses leading or trailing spaces; a secret
    /// that no client can send is better refused at start than at every request.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Secret, SecretError> {
        let bytes = bytes.into();
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&bytes.len()) {
            return Err(SecretError::Length(bytes.len()));
        }
        if let Some(at) = bytes.iter().position(|b| !b.is_ascii_graphic()) {
            return Err(SecretError::Byte(at));
        }
        Ok(Secret(bytes.into_boxed_slice()))
    }

    /// The content of the file at `path`, one trailing newline (`\n` or `\r\n`) stripped, as
    /// editors and `echo` leave one.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        Secret::new(read_trimmed(path)?)
    }

    /// Whether `presented` is this secret. The time taken depends on the lengths only, never
    /// on where the first differing byte is (`subtle`'s comparison), so timing tells an
    /// attacker nothing about how much of a guess was right.
    pub fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.0.as_ref().ct_eq(presented))
    }

    /// The `Authorization` header value that presents this secret.
    pub fn bearer_header(&self) -> String {
        // `new` admits visible ASCII only, so this is the bytes unchanged.
        format!("Bearer {}", String::from_utf8_lossy(&self.0))
    }
}

/// The content of `path` without one trailing newline (`\n` or `\r\n`).
fn read_trimmed(path: &Path) -> Result<Vec<u8>, SecretError> {
    let mut bytes = std::fs::read(path).map_err(|e| SecretError::File {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    Ok(bytes)
}

/// A secret as last published by its owner (the service's reloader, PROTOCOL.md §15.1): a
/// reader takes the current one each time it needs it.
pub type LiveSecret = tokio::sync::watch::Receiver<Secret>;

/// The most secrets accepted at once: the current one and the next (PROTOCOL.md §15.1).
pub const MAX_SECRETS: usize = 2;

/// The secrets clients may present, 1 or [`MAX_SECRETS`] of them, numbered from 1 in the order
/// given (PROTOCOL.md §15.1).
#[derive(Clone, Debug)]
pub struct Secrets(Vec<Secret>);

impl Secrets {
    /// One secret.
    pub fn one(secret: Secret) -> Secrets {
        Secrets(vec![secret])
    }

    /// The secrets of `paths` in order, each file holding one secret a line (one trailing
    /// newline dropped; an empty line is invalid).
    pub fn from_files(paths: &[impl AsRef<Path>]) -> Result<Secrets, SecretError> {
        let mut all = Vec::new();
        for path in paths {
            let path = path.as_ref();
            let bytes = read_trimmed(path)?;
            for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                all.push(Secret::new(line).map_err(|e| SecretError::Line {
                    path: path.display().to_string(),
                    line: i + 1,
                    source: Box::new(e),
                })?);
            }
        }
        match all.len() {
            0 => Err(SecretError::Length(0)),
            1..=MAX_SECRETS => Ok(Secrets(all)),
            n => Err(SecretError::TooMany(n)),
        }
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never: there is at least one.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Which secret (numbered from 1) `presented` is, if any. Every secret is compared, each in
    /// constant time ([`Secret::matches`]), whichever matches, so the time taken tells nothing
    /// about which one did.
    pub fn which(&self, presented: &[u8]) -> Option<usize> {
        let mut found = None;
        for (i, s) in self.0.iter().enumerate() {
            if s.matches(presented) {
                found = found.or(Some(i + 1));
            }
        }
        found
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "0123456789abcdef-secret";

    #[test]
    fn debug_and_display_redact() {
        let s = Secret::new(GOOD).unwrap();
        for shown in [format!("{s:?}"), format!("{s}"), format!("{:?}", Some(&s))] {
            assert!(!shown.contains("0123456789"), "{shown}");
            assert!(shown.contains("redacted"), "{shown}");
        }
    }

    #[test]
    fn length_is_16_to_4096_bytes() {
        assert_eq!(
            Secret::new("a".repeat(15)).unwrap_err(),
            SecretError::Length(15)
        );
        assert!(Secret::new("a".repeat(16)).is_ok());
        assert!(Secret::new("a".repeat(4096)).is_ok());
        assert_eq!(
            Secret::new("a".repeat(4097)).unwrap_err(),
            SecretError::Length(4097)
        );
    }

    #[test]
    fn bytes_a_header_cannot_carry_are_refused() {
        assert_eq!(
            Secret::new("0123456789 abcdef").unwrap_err(),
            SecretError::Byte(10)
        );
        assert_eq!(
            Secret::new("0123456789abcdef\n").unwrap_err(),
            SecretError::Byte(16)
        );
    }

    #[test]
    fn matches_only_the_whole_secret() {
        let s = Secret::new(GOOD).unwrap();
        assert!(s.matches(GOOD.as_bytes()));
        assert!(!s.matches(&GOOD.as_bytes()[..GOOD.len() - 1]));
        assert!(!s.matches(format!("{GOOD}x").as_bytes()));
        assert!(!s.matches(b""));
        assert_eq!(s.bearer_header(), format!("Bearer {GOOD}"));
    }

    #[test]
    fn a_file_loses_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        for (content, ok) in [
            (format!("{GOOD}\n"), true),
            (format!("{GOOD}\r\n"), true),
            (GOOD.to_string(), true),
            (format!("{GOOD}\n\n"), false),
        ] {
            let path = dir.path().join("secret");
            std::fs::write(&path, &content).unwrap();
            match Secret::from_file(&path) {
                Ok(s) => assert!(ok && s.matches(GOOD.as_bytes()), "{content:?}"),
                Err(e) => assert!(!ok, "{content:?}: {e}"),
            }
        }
        let e = Secret::from_file(&dir.path().join("absent")).unwrap_err();
        assert!(matches!(e, SecretError::File { .. }), "{e}");
    }

    #[test]
    fn two_secrets_come_from_two_files_or_two_lines_of_one_and_never_more() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let next = "fedcba9876543210-secret";
        std::fs::write(&a, format!("{GOOD}\r\n{next}\n")).unwrap();
        let two = Secrets::from_files(&[&a]).unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two.which(GOOD.as_bytes()), Some(1));
        assert_eq!(two.which(next.as_bytes()), Some(2));
        assert_eq!(two.which(b"0123456789abcdef-secreX"), None);
        std::fs::write(&b, format!("{next}\n")).unwrap();
        std::fs::write(&a, GOOD).unwrap();
        let files = Secrets::from_files(&[&a, &b]).unwrap();
        assert_eq!(files.which(next.as_bytes()), Some(2));
        std::fs::write(&a, format!("{GOOD}\n{next}")).unwrap();
        let e = Secrets::from_files(&[&a, &b]).unwrap_err();
        assert_eq!(e, SecretError::TooMany(3));
        std::fs::write(&a, format!("{GOOD}\n\n{next}")).unwrap();
        let e = Secrets::from_files(&[&a]).unwrap_err().to_string();
        assert!(e.starts_with("line 2 of ") && !e.contains(GOOD), "{e}");
    }
}
