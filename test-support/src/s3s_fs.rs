//! s3s-fs, a local S3-compatible server that checks SigV4 signatures, installed into the project
//! by `scripts/install-s3s-fs.sh` (which says why it stands beside moto) and started on a free
//! loopback port with one access key and its secret: a request signed with any other secret is
//! answered 403 `SignatureDoesNotMatch`, as S3 answers it. moto ([`crate::s3`]) accepts any key,
//! so a wrong secret is tested here.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::stock_litestream::{repo_root, run_install_script};

/// The install folder: `$CHANGE_STREAMER_S3S_DIR`, else `.tools/s3s-fs`.
fn install_dir() -> PathBuf {
    std::env::var_os("CHANGE_STREAMER_S3S_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/s3s-fs"))
}

/// Installs s3s-fs if it is not yet (once per process, serialised across processes) and says
/// where its binary is. Panics, with the script's own message, when it cannot be installed.
pub fn install() -> PathBuf {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED
        .get_or_init(|| run_install_script("scripts/install-s3s-fs.sh", &install_dir())("S3S_FS"))
        .clone()
}

/// A running s3s-fs on loopback, its buckets folders of `root`; killed when dropped.
pub struct SigningS3 {
    child: Child,
    /// `127.0.0.1:port`.
    pub addr: String,
}

impl SigningS3 {
    /// Starts s3s-fs (installing it first if needed) with `access_key` and `secret_key`, serving
    /// `buckets` (folders made under `root`), and returns once it accepts connections.
    pub fn start(root: &Path, access_key: &str, secret_key: &str, buckets: &[&str]) -> SigningS3 {
        let bin = install();
        for b in buckets {
            std::fs::create_dir_all(root.join(b)).expect("a bucket's folder");
        }
        for _ in 0..3 {
            let port = crate::process::free_port();
            let child = Command::new(&bin)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--access-key", access_key, "--secret-key", secret_key])
                .arg(root)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start s3s-fs");
            let mut server = SigningS3 {
                child,
                addr: format!("127.0.0.1:{port}"),
            };
            if server.answers_within(Duration::from_secs(30)) {
                return server;
            }
        }
        panic!("s3s-fs exited three times before accepting connections (ports taken?)");
    }

    /// Whether it accepts connections before `limit`; false once it exited (its port taken).
    fn answers_within(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while TcpStream::connect(&self.addr).is_err() {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "s3s-fs did not listen on {}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// `http://127.0.0.1:port`, the endpoint of an `s3://` URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for SigningS3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
