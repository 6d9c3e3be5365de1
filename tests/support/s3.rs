//! A real S3 server on loopback for the object-storage tests: moto's server mode, installed into
//! the project's `.venv` by `scripts/setup.sh` (`clients/python/requirements-test.txt`). Missing,
//! it fails the test with the command that installs it, never skips it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use minibatchd_engine::remote::ObjectStore as _;
use minibatchd_remote::{aws::Settings, S3Objects};

use super::daemon::{python, KillOnDrop, DEADLINE};

/// A moto S3 server on a free loopback port, stopped when dropped.
pub struct S3Server {
    _child: KillOnDrop,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The port.
    pub port: u16,
}

/// A free loopback port (bound and released: another process could take it first, rarely).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl S3Server {
    /// Starts the server and waits until it answers.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server that checks credentials (moto's IAM: no key is known, so every request
    /// is refused `403`).
    pub fn start_checking_credentials() -> Self {
        Self::start_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "0")])
    }

    fn start_with(env: &[(&str, &str)]) -> Self {
        let py = PathBuf::from(python());
        let moto = py.parent().map(|d| d.join("moto_server")).expect("the venv's bin directory");
        assert!(
            moto.exists(),
            "{} is missing: run scripts/setup.sh (it installs moto[server] from clients/python/requirements-test.txt)",
            moto.display()
        );
        let port = free_port();
        let child = Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let server = Self { _child: KillOnDrop(child), endpoint: format!("http://127.0.0.1:{port}"), port };
        let start = Instant::now();
        while server.request("GET", "/", b"").is_none() {
            assert!(start.elapsed() < DEADLINE, "moto_server did not answer on port {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// The AWS environment that points a daemon (or any AWS client) at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
            // No profile files of the machine's user.
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent".into()),
            ("AWS_CONFIG_FILE", "/nonexistent".into()),
        ]
    }

    /// A client of this server (for uploads).
    pub fn client(&self) -> S3Objects {
        S3Objects::new(Settings {
            access_key_id: Some("testing".into()),
            secret_access_key: Some("testing".into()),
            region: Some("us-east-1".into()),
            endpoint: Some(self.endpoint.clone()),
            ..Settings::default()
        })
        .expect("an S3 client")
    }

    /// One plain HTTP/1.1 request (moto accepts unsigned ones for setup): the status code.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> Option<u16> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(DEADLINE)).ok()?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            body.len()
        )
        .ok()?;
        s.write_all(body).ok()?;
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        reply.split_whitespace().nth(1)?.parse().ok()
    }

    /// Creates bucket `name`.
    pub fn create_bucket(&self, name: &str) {
        assert_eq!(self.request("PUT", &format!("/{name}"), b""), Some(200), "creating bucket {name}");
    }

    /// Uploads `bytes` to `s3://bucket/key`.
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let url = format!("s3://{bucket}/{key}");
        let c = self.client();
        let _ = c.delete(&url);
        assert!(c.put_if_absent(&url, bytes.to_vec()).expect("upload"), "{url} exists");
    }

    /// Uploads every file below `dir` to `s3://bucket/prefix/<relative path>`.
    pub fn put_tree(&self, bucket: &str, prefix: &str, dir: &Path) {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let rel = p.strip_prefix(dir).expect("below").to_string_lossy().into_owned();
                    self.put(bucket, &format!("{prefix}/{rel}"), &std::fs::read(&p).expect("read"));
                }
            }
        }
    }
}

/// `scripts/dev/s3_fault_proxy.py` in front of a server: latency and injected faults.
pub struct FaultProxy {
    _child: KillOnDrop,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    port: u16,
}

impl FaultProxy {
    /// Starts the proxy before `server` with the proxy's own flags (`--delay-ms 20`, ...).
    pub fn start(server: &S3Server, flags: &[&str]) -> Self {
        let port = free_port();
        let child = Command::new(python())
            .arg(super::package_root().join("scripts/dev/s3_fault_proxy.py"))
            .args(["--listen", &port.to_string(), "--upstream", &format!("127.0.0.1:{}", server.port)])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the fault proxy");
        let proxy = Self { _child: KillOnDrop(child), endpoint: format!("http://127.0.0.1:{port}"), port };
        let start = Instant::now();
        while proxy.stats().is_none() {
            assert!(start.elapsed() < DEADLINE, "the fault proxy did not answer on port {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        proxy
    }

    /// From now on the proxy answers nothing: requests are read and never answered, responses
    /// being sent stop where they are, their connections held open.
    pub fn stall(&self) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to the fault proxy");
        s.set_read_timeout(Some(DEADLINE)).expect("timeout");
        write!(s, "GET /__proxy_stall HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("write");
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        assert!(reply.starts_with("HTTP/1.1 200"), "the proxy did not stall: {reply:?}");
    }

    /// The proxy's counts: requests, failed, reset, slowed, stalled.
    pub fn stats(&self) -> Option<serde_json::Value> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(DEADLINE)).ok()?;
        write!(s, "GET /__proxy_stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
        let mut reply = String::new();
        s.read_to_string(&mut reply).ok()?;
        serde_json::from_str(reply.split("\r\n\r\n").nth(1)?).ok()
    }
}
