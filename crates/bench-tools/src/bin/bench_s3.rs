//! `minibatchd-bench-s3`: a small S3-compatible server of a local directory for the
//! object-storage benchmark (`scripts/bench/bench_objects.py`), with latency added to every request.
//!
//! ```text
//! minibatchd-bench-s3 --root DIR --port PORT [--delay-ms 20]
//! ```
//!
//! `DIR/BUCKET/KEY` is object `s3://BUCKET/KEY`. It answers what minibatchd asks of S3 —
//! `ListObjectsV2` (prefix), `HEAD`, `GET` with `Range` and `If-Match`, `PUT` with
//! `If-None-Match: *`, `DELETE` — over HTTP/1.1 with keep-alive, one thread per connection,
//! streaming file bytes with `pread`. Every request waits `--delay-ms` before it is answered (a
//! round trip to a remote region). The ETag is a hash of the file's size, modification time and
//! inode (no content hash: serving is not bound by hashing). Signatures are not checked. Not part
//! of the daemon: the moto server in the tests is the reference S3 implementation; this one is
//! fast enough that a benchmark measures minibatchd rather than the server.

#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let (Some(root), Some(port)) = (value("--root"), value("--port")) else {
        eprintln!("usage: minibatchd-bench-s3 --root DIR --port PORT [--delay-ms MS]");
        std::process::exit(2);
    };
    let delay =
        Duration::from_secs_f64(value("--delay-ms").and_then(|d| d.parse::<f64>().ok()).unwrap_or(0.0) / 1000.0);
    let listener = match TcpListener::bind(("127.0.0.1", port.parse::<u16>().unwrap_or(0))) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("minibatchd-bench-s3: cannot listen on port {port}: {e}");
            std::process::exit(1);
        }
    };
    let root = PathBuf::from(root);
    for stream in listener.incoming().flatten() {
        let root = root.clone();
        std::thread::spawn(move || {
            let _ = serve(stream, &root, delay);
        });
    }
}

struct Request {
    method: String,
    path: String,
    query: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let (path, query) =
        target.split_once('?').map_or((target.clone(), String::new()), |(p, q)| (p.to_owned(), q.to_owned()));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let mut req = Request { method, path: decode(&path), query, headers, body: Vec::new() };
    let len: usize = req.header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    req.body.resize(len, 0);
    r.read_exact(&mut req.body)?;
    Ok(Some(req))
}

/// Percent-decoding of a URL path or query value.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn etag(meta: &std::fs::Metadata) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in [meta.len(), meta.mtime().cast_unsigned(), meta.mtime_nsec().cast_unsigned(), meta.ino()] {
        for byte in v.to_le_bytes() {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    format!("\"{h:016x}\"")
}

fn respond(w: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        let _ = write!(head, "{k}: {v}\r\n");
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    w.write_all(body)
}

fn serve(stream: TcpStream, root: &Path, delay: Duration) -> std::io::Result<()> {
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    while let Some(req) = read_request(&mut r)? {
        std::thread::sleep(delay);
        let (bucket, key) =
            req.path.trim_start_matches('/').split_once('/').unwrap_or((req.path.trim_start_matches('/'), ""));
        // A benchmark server on loopback, but still: no key leaves the served directory.
        if req.path.split('/').any(|c| c == "..") {
            respond(&mut w, "400 Bad Request", &[], b"<Error><Code>InvalidURI</Code></Error>")?;
            continue;
        }
        let file = root.join(bucket).join(key);
        match req.method.as_str() {
            "GET" if key.is_empty() => list(&mut w, &root.join(bucket), &req)?,
            "GET" | "HEAD" => get(&mut w, &file, &req)?,
            "PUT" if key.is_empty() => {
                std::fs::create_dir_all(&file)?;
                respond(&mut w, "200 OK", &[], b"")?;
            }
            "PUT" => {
                if req.header("if-none-match") == Some("*") && file.exists() {
                    respond(&mut w, "412 Precondition Failed", &[], b"<Error><Code>PreconditionFailed</Code></Error>")?;
                    continue;
                }
                if let Some(dir) = file.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::write(&file, &req.body)?;
                let tag = etag(&std::fs::metadata(&file)?);
                respond(&mut w, "200 OK", &[("ETag", tag)], b"")?;
            }
            // DeleteObjects: `POST /bucket?delete` with the keys in XML (what object_store sends).
            "POST" if req.query.starts_with("delete") => {
                let body = String::from_utf8_lossy(&req.body);
                let mut deleted = String::new();
                for part in body.split("<Key>").skip(1) {
                    let k = part.split("</Key>").next().unwrap_or_default();
                    let k = k.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">");
                    if k.split('/').any(|c| c == "..") {
                        continue;
                    }
                    let _ = std::fs::remove_file(root.join(bucket).join(&k));
                    let _ = write!(
                        deleted,
                        "<Deleted><Key>{}</Key></Deleted>",
                        k.replace('&', "&amp;").replace('<', "&lt;")
                    );
                }
                let xml = format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?><DeleteResult>{deleted}</DeleteResult>");
                respond(&mut w, "200 OK", &[("Content-Type", "application/xml".into())], xml.as_bytes())?;
            }
            "DELETE" => {
                let _ = std::fs::remove_file(&file);
                respond(&mut w, "204 No Content", &[], b"")?;
            }
            _ => respond(&mut w, "405 Method Not Allowed", &[], b"")?,
        }
    }
    Ok(())
}

fn not_found(w: &mut TcpStream, code: &str) -> std::io::Result<()> {
    respond(w, "404 Not Found", &[], format!("<Error><Code>{code}</Code></Error>").as_bytes())
}

fn get(w: &mut TcpStream, file: &Path, req: &Request) -> std::io::Result<()> {
    let Ok(f) = std::fs::File::open(file) else { return not_found(w, "NoSuchKey") };
    let meta = f.metadata()?;
    if !meta.is_file() {
        return not_found(w, "NoSuchKey");
    }
    let tag = etag(&meta);
    if req.header("if-match").is_some_and(|m| m != tag) {
        return respond(w, "412 Precondition Failed", &[], b"<Error><Code>PreconditionFailed</Code></Error>");
    }
    let size = meta.len();
    let (start, end, status) =
        match req.header("range").and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.split_once('-')) {
            Some((a, b)) => {
                let start: u64 = a.parse().unwrap_or(0);
                let end: u64 = b.parse::<u64>().map_or(size, |e| (e + 1).min(size));
                (start.min(end), end, "206 Partial Content")
            }
            None => (0, size, "200 OK"),
        };
    let modified = httpdate(meta.mtime());
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nETag: {tag}\r\nLast-Modified: {modified}\r\nAccept-Ranges: bytes\r\n",
        end - start
    );
    if status.starts_with("206") {
        let _ = write!(head, "Content-Range: bytes {start}-{}/{size}\r\n", end.saturating_sub(1));
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    if req.method == "HEAD" {
        return Ok(());
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut at = start;
    while at < end {
        let n = usize::try_from((end - at).min(buf.len() as u64)).unwrap_or(buf.len());
        f.read_exact_at(&mut buf[..n], at)?;
        w.write_all(&buf[..n])?;
        at += n as u64;
    }
    Ok(())
}

/// `ListObjectsV2` of everything under `prefix` (one page).
fn list(w: &mut TcpStream, bucket: &Path, req: &Request) -> std::io::Result<()> {
    if !bucket.is_dir() {
        return not_found(w, "NoSuchBucket");
    }
    let prefix = req.query.split('&').find_map(|kv| kv.strip_prefix("prefix=")).map(decode).unwrap_or_default();
    let mut found = Vec::new();
    let mut stack = vec![bucket.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(bucket) {
                let key = rel.to_string_lossy().into_owned();
                if key.starts_with(&prefix) {
                    found.push((key, e.metadata()?));
                }
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let mut xml =
        String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><IsTruncated>false</IsTruncated>");
    for (key, meta) in &found {
        let key = key.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let _ = write!(
            xml,
            "<Contents><Key>{key}</Key><Size>{}</Size><ETag>{}</ETag><LastModified>{}</LastModified></Contents>",
            meta.len(),
            etag(meta).replace('"', "&quot;"),
            iso(meta.mtime())
        );
    }
    let _ = write!(xml, "<KeyCount>{}</KeyCount></ListBucketResult>", found.len());
    respond(w, "200 OK", &[("Content-Type", "application/xml".into())], xml.as_bytes())
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil(secs: i64) -> (i64, u32, u32, i64) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    (yoe + era * 400 + i64::from(m <= 2), m, d, rem)
}

fn iso(secs: i64) -> String {
    let (y, m, d, rem) = civil(secs);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.000Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn httpdate(secs: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (y, m, d, rem) = civil(secs);
    let wd = DAYS[usize::try_from(secs.div_euclid(86_400).rem_euclid(7)).unwrap_or(0)];
    format!(
        "{wd}, {d:02} {} {y:04} {:02}:{:02}:{:02} GMT",
        MONTHS[(m - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
