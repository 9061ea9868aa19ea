//! What the VFS reader's environment and an `s3://` backup's answers mean (PROTOCOL.md §8.4,
//! "On S3" and "The environment"): a variable that breaks litestream 0.5.17's S3 client, found
//! before a reader starts, and a read of an `s3://` backup that failed, said for what it is in
//! front of litestream's own text, so that `lastError` tells what to do. litestream 0.5.17's VFS
//! reduces every failure to open an `s3://` backup (a 403 for a wrong secret, a missing bucket,
//! an unreachable endpoint) to SQLite's `SQL logic error`; its CLI (`litestream ltx URL`) shows
//! the object store's own answer.

/// Variables that make litestream 0.5.17's S3 client refuse to start, each with what to do.
pub const BREAKING_VARIABLES: [(&str, &str); 1] = [(
    "AWS_CA_BUNDLE",
    "litestream 0.5.17's S3 client refuses to start with it (`unable to add custom RootCAs \
     HTTPClient`): unset it in the service's environment (and in litestream replicate's); for an \
     endpoint whose certificate a private CA signed, add that CA to the system's trust store or \
     point SSL_CERT_FILE at it",
)];

/// The words of litestream's error when an object store refused the request's credentials.
const REFUSED: [&str; 5] = [
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "AccessDenied",
    "StatusCode: 403",
    "403 Forbidden",
];

/// Why a reader of `backup_url` must not start with the environment `get` gives (the service's
/// own, with the reader's overrides), or `None`. Only `s3://` backups are concerned.
pub fn breaking_variable(backup_url: &str, get: impl Fn(&str) -> Option<String>) -> Option<String> {
    if !backup_url.starts_with("s3://") {
        return None;
    }
    BREAKING_VARIABLES.iter().find_map(|(name, what)| {
        get(name).filter(|v| !v.is_empty()).map(|_| {
            format!("{name} is set in the VFS reader's environment for {backup_url}: {what}")
        })
    })
}

/// The reader's error `text` for `backup_url`, with what it means in front when the object
/// store refused the credentials, or when a breaking variable's symptom shows.
pub fn explain(backup_url: &str, text: String) -> String {
    if REFUSED.iter().any(|w| text.contains(w)) {
        return format!(
            "backup {backup_url}: the object store refused the credentials (403): check the \
             backup's s3_credentials_file or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY: {text}"
        );
    }
    if backup_url.starts_with("s3://") && text.contains("SQL logic error") {
        return format!(
            "backup {backup_url}: litestream's VFS gives no reason when it cannot open an s3:// \
             backup: refused credentials (403: check the backup's s3_credentials_file or \
             AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), a missing bucket or an unreachable \
             endpoint all read as this; `litestream ltx '{backup_url}'` with the same environment \
             shows which: {text}"
        );
    }
    if text.contains("custom RootCAs") {
        return format!(
            "backup {backup_url}: AWS_CA_BUNDLE reached the VFS reader: {}: {text}",
            BREAKING_VARIABLES[0].1
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_ca_bundle_breaks_only_s3_backups_and_is_named_with_what_to_do() {
        let set = |n: &str| (n == "AWS_CA_BUNDLE").then(|| "/etc/ca.pem".to_string());
        let why = breaking_variable("s3://b/p", set).expect("named");
        assert!(
            why.contains("AWS_CA_BUNDLE") && why.contains("unset it"),
            "{why}"
        );
        assert!(
            !why.contains("/etc/ca.pem"),
            "the value is not shown: {why}"
        );
        assert_eq!(breaking_variable("file:///b", set), None);
        assert_eq!(breaking_variable("s3://b/p", |_| None), None);
        assert_eq!(breaking_variable("s3://b/p", |_| Some(String::new())), None);
    }

    #[test]
    fn a_refused_read_says_so_before_litestreams_text() {
        let text = "open: operation error S3: ListObjectsV2, https response error StatusCode: 403, RequestID: x, api error SignatureDoesNotMatch: no".to_string();
        let said = explain("s3://b/p", text.clone());
        assert!(
            said.starts_with("backup s3://b/p: the object store refused the credentials (403)"),
            "{said}"
        );
        assert!(said.ends_with(&text), "{said}");
        assert_eq!(explain("s3://b/p", "no such table".into()), "no such table");
        let opaque = explain("s3://b/p", "cannot open the backup: SQL logic error".into());
        assert!(
            opaque.contains("403") && opaque.contains("litestream ltx 's3://b/p'"),
            "{opaque}"
        );
        let local = "cannot open the backup: SQL logic error".to_string();
        assert_eq!(explain("file:///b", local.clone()), local);
    }
}
