//! The dashboard and the alerts against a real Prometheus (Debian's `prometheus` package,
//! installed by `scripts/setup.sh`): the daemon runs on loopback, a Prometheus server scrapes it
//! every second with `conf/grafana/alerts.yml` loaded, and the test drives what an operator sees —
//! a cold start, sessions that read, a refused `open`, a client killed mid-stream, a reload, a
//! dataset that fails to open, periodic checkpoints. Then every query of
//! `conf/grafana/minibatchd.json` and every alert expression is evaluated over the whole run
//! through Prometheus's HTTP API (`query_range`, a step per second): each must return data, no
//! point may be NaN or ±Inf, and the values must fit the unit the panel claims (ratios within
//! [0, 1], bytes, seconds and rates never negative). `promtool test rules` runs the alerts' unit
//! tests (`conf/grafana/alerts.test.yml`), and `scripts/ops/render_dashboard.py` renders every panel
//! to a PNG from this Prometheus.

mod support;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use minibatchd_client::protocol::{ErrorCode, SessionOptions};
use minibatchd_client::{Client, ClientError};
use support::daemon::{client_dir, drain, options, python, train_ctf, Daemon, KillOnDrop, TRAIN_STREAMS_TOML};
use support::{package_root, write};

/// Where Debian's package puts the server and its tool.
fn tool(name: &str) -> PathBuf {
    let p = PathBuf::from("/usr/bin").join(name);
    assert!(p.exists(), "{} is missing: run scripts/setup.sh (it installs Debian's prometheus package)", p.display());
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// GET `path` from `127.0.0.1:port` (HTTP/1.0: no chunked body); the body.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs_f64()
}

/// A dashboard query made concrete: every instance and dataset, a 10 s rate window (ten scrapes).
fn concrete(expr: &str) -> String {
    expr.replace("$instance", ".*").replace("$dataset", ".*").replace("$__rate_interval", "10s")
}

/// An alert expression without its threshold, so that it returns data on a healthy daemon too
/// (`absent(x)` becomes `x`).
fn alert_value(expr: &str) -> String {
    if let Some(inner) = expr.strip_prefix("absent(").and_then(|e| e.strip_suffix(')')) {
        return inner.to_owned();
    }
    let cut = [" > ", " < ", " == "].iter().filter_map(|op| expr.rfind(op)).max();
    match cut {
        Some(i) if expr[i + 3..].trim().parse::<f64>().is_ok() => expr[..i].to_owned(),
        _ => expr.to_owned(),
    }
}

/// Evaluates `expr` over `[start, end]` every second; every point must be finite and fit `unit`.
fn check_range(port: u16, what: &str, expr: &str, unit: &str, start: f64, end: f64) -> Result<usize, String> {
    let path = format!("/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1", encode(expr));
    let body = get(port, &path).ok_or_else(|| format!("{what}: no answer from Prometheus"))?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{what}: {e}: {body}"))?;
    if v["status"] != "success" {
        return Err(format!("{what}: {expr}: {body}"));
    }
    let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
    let mut points = 0;
    for series in &result {
        for p in series["values"].as_array().into_iter().flatten() {
            let text = p[1].as_str().unwrap_or("");
            let x: f64 = text.parse().map_err(|_| format!("{what}: value {text:?}"))?;
            if !x.is_finite() {
                return Err(format!("{what}: {expr} gives {text} for {}", series["metric"]));
            }
            let fits = match unit {
                "percentunit" => (0.0..=1.0 + 1e-9).contains(&x),
                "bytes" | "Bps" | "s" | "decbytes" | "ops" | "reqps" | "cps" => x >= 0.0,
                _ => true,
            };
            if !fits {
                return Err(format!(
                    "{what}: {expr} gives {x} for {}, outside what the unit {unit} allows",
                    series["metric"]
                ));
            }
            points += 1;
        }
    }
    if points == 0 {
        return Err(format!("{what}: {expr} returned no data over the run"));
    }
    Ok(points)
}

fn write_config(dir: &Path) {
    let d = dir.display();
    // `broken` names a file that is not there: it fails to open (minibatchd_datasets{state="failed"}).
    let cfg = format!(
        "[daemon]\nsocket = \"{d}/mbd.sock\"\nmetrics_listen = \"127.0.0.1:0\"\nstate_dir = \"{d}/state\"\n\
         memory_limit_bytes = 268435456\nring_slots = 4\nslot_size_bytes = 65536\nsession_linger_secs = 600\n\
         checkpoint_interval_secs = 1\nhost_memory_reserve_bytes = 0\n\n\
         [datasets.train]\nformat = \"ctf\"\nfiles = [\"{d}/train.ctf\"]\nchunk_size_bytes = 300\nmax_errors = 100\n{TRAIN_STREAMS_TOML}\n\
         [datasets.broken]\nformat = \"ctf\"\nfiles = [\"{d}/missing.ctf\"]\n[datasets.broken.streams.x]\ndim = 1\nformat = \"dense\"\n\
         [datasets.again]\nformat = \"ctf\"\nfiles = [\"{d}/train.ctf\"]\nchunk_size_bytes = 300\nmax_errors = 100\n{again}\n\
         [mixtures.blend]\ndatasets = [\"train\", \"again\"]\nweights = [3, 1]\n",
        again = TRAIN_STREAMS_TOML.replace("datasets.train.", "datasets.again.")
    );
    write(dir, "minibatchd.toml", cfg);
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, told in order
fn every_panel_and_alert_returns_finite_data_from_a_real_prometheus() {
    let promtool = tool("promtool");
    let prometheus = tool("prometheus");
    let root = package_root();

    // The alerts' own unit tests first: each fires on trouble and stays silent when healthy.
    let rules = Command::new(&promtool)
        .args(["test", "rules"])
        .arg(root.join("conf/grafana/alerts.test.yml"))
        .output()
        .expect("promtool");
    assert!(
        rules.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&rules.stdout),
        String::from_utf8_lossy(&rules.stderr)
    );

    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    // A malformed value in one sequence (charged to max_errors: parse errors by kind).
    write(dir, "train.ctf", train_ctf() + "150 |F 150 x 1 |L 0:1\n150 |F 150 1.5 2\n");
    write_config(dir);
    let start = unix_now();
    let d = Daemon::start(dir, &[]);
    let metrics_addr = std::fs::read_to_string(dir.join("state/metrics.addr")).expect("metrics.addr");

    let port = free_port();
    let prom_dir = dir.join("prometheus");
    std::fs::create_dir_all(&prom_dir).expect("mkdir");
    let prom_cfg = write(
        &prom_dir,
        "prometheus.yml",
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: minibatchd\n    static_configs:\n      - targets: [\"{}\"]\n",
            root.join("conf/grafana/alerts.yml").display(),
            metrics_addr.trim()
        ),
    );
    let _prom = KillOnDrop(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", prom_cfg.display()))
            .arg(format!("--storage.tsdb.path={}", prom_dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    let t0 = Instant::now();
    while !get(port, "/api/v1/targets").is_some_and(|b| b.contains("\"health\":\"up\"")) {
        assert!(t0.elapsed() < Duration::from_secs(60), "Prometheus never scraped the daemon");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Sessions: a full sweep (cold start: every chunk loaded), a refused open, a Python client
    // killed mid-stream, a reload, and a reader that keeps going while the queries' windows fill.
    let mut s = d.client().open("train", &SessionOptions { full_sweep: true, ..options(8) }).expect("open");
    assert!(!drain(&mut s, 100_000).is_empty());
    drop(s);
    match Client::connect(&d.socket).and_then(|c| c.open("nope", &options(4))) {
        Err(ClientError::Daemon { code: ErrorCode::UnknownDataset, .. }) => {}
        other => panic!("open of an unknown dataset: {other:?}"),
    }
    let script = format!(
        "import sys, time, minibatchd\ns = minibatchd.connect({sock:?}).open('train', minibatch_size=4, session='doomed')\nit = iter(s)\nnext(it)\nprint('reading', flush=True)\ntime.sleep(120)\n",
        sock = d.socket.display().to_string()
    );
    let mut doomed = KillOnDrop(
        Command::new(python())
            .args(["-c", &script])
            .env("PYTHONPATH", client_dir())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python client"),
    );
    let mut line = [0u8; 8];
    doomed.0.stdout.as_mut().expect("stdout").read_exact(&mut line).expect("the client read a minibatch");
    let _ = doomed.0.kill();
    let _ = doomed.0.wait();
    d.signal(rustix::process::Signal::HUP);
    let reading = std::thread::spawn({
        let socket = d.socket.clone();
        move || {
            let mut s = Client::connect(&socket)
                .and_then(|c| c.open("train", &SessionOptions { max_sweeps: Some(1000), ..options(4) }))
                .expect("open");
            let until = Instant::now() + Duration::from_secs(16);
            while Instant::now() < until {
                if s.next_owned().expect("next").is_none() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    // A mixture of `train` and another dataset of the same file, read meanwhile (its per-source
    // panels).
    let mixing = std::thread::spawn({
        let socket = d.socket.clone();
        move || {
            let mut s = Client::connect(&socket).and_then(|c| c.open("blend", &options(4))).expect("open blend");
            let until = Instant::now() + Duration::from_secs(16);
            while Instant::now() < until && s.next_owned().expect("next").is_some() {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    reading.join().expect("reader");
    mixing.join().expect("mixture reader");
    std::thread::sleep(Duration::from_secs(3));
    let end = unix_now();

    // Every panel's queries, and every alert's expression (without its threshold).
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("conf/grafana/minibatchd.json")).expect("dashboard"))
            .expect("dashboard json");
    let mut failures = Vec::new();
    let mut checked = 0;
    for panel in dash["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap_or("?");
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = concrete(t["expr"].as_str().expect("expr"));
            // An override by query (refId) may give a target its own unit.
            let unit = support::dashboard_unit(panel, t);
            let what = format!("panel {title:?} ({})", t["legendFormat"].as_str().unwrap_or(""));
            match check_range(port, &what, &expr, &unit, start, end) {
                Ok(_) => checked += 1,
                Err(e) => failures.push(e),
            }
        }
    }
    let alerts = std::fs::read_to_string(root.join("conf/grafana/alerts.yml")).expect("alerts");
    let mut alert_exprs = 0;
    for line in alerts.lines() {
        if let Some(expr) = line.trim().strip_prefix("expr: ") {
            alert_exprs += 1;
            let expr = alert_value(expr);
            match check_range(port, &format!("alert {expr}"), &expr, "short", start, end) {
                Ok(_) => checked += 1,
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(alert_exprs >= 14, "{alert_exprs} alert expressions");

    // Every exported metric is on a panel, or on docs/metrics.md's list of those deliberately not
    // shown.
    let exported = get(port, &format!("/api/v1/label/__name__/values?start={start:.0}&end={end:.0}")).expect("names");
    let exported: serde_json::Value = serde_json::from_str(&exported).expect("names json");
    let dash_text = std::fs::read_to_string(root.join("conf/grafana/minibatchd.json")).expect("dashboard");
    let not_shown = ["minibatchd_object_"];
    let missing: Vec<&str> = exported["data"]
        .as_array()
        .expect("names")
        .iter()
        .filter_map(|n| n.as_str())
        .filter(|n| n.starts_with("minibatchd_"))
        .filter(|n| !dash_text.contains(&format!("{n}{{")) && !dash_text.contains(&format!("{n}[")))
        .filter(|n| !not_shown.iter().any(|p| n.starts_with(p)))
        // The old names of renamed metrics, served for one release; the panels use the new ones.
        .filter(|n| !minibatchd::metrics::RENAMED.iter().any(|(_, before)| n == before))
        .collect();
    assert!(missing.is_empty(), "exported but on no panel (add one, or list them in docs/metrics.md): {missing:?}");
    assert!(failures.is_empty(), "{} of the queries fail:\n{}", failures.len(), failures.join("\n"));
    println!("{checked} queries checked over {:.0} s", end - start);

    // Every panel as a PNG, from this Prometheus (into MINIBATCHD_DASHBOARD_PNG_DIR when set, to
    // look at them).
    let out = std::env::var_os("MINIBATCHD_DASHBOARD_PNG_DIR").map_or_else(|| dir.join("png"), PathBuf::from);
    let render = Command::new(python())
        .arg(root.join("scripts/ops/render_dashboard.py"))
        .args(["--prometheus", &format!("http://127.0.0.1:{port}"), "--out"])
        .arg(&out)
        .args(["--start", &format!("{start:.0}"), "--end", &format!("{end:.0}")])
        .output()
        .expect("render_dashboard.py");
    assert!(
        render.status.success(),
        "render_dashboard.py:\n{}{}",
        String::from_utf8_lossy(&render.stdout),
        String::from_utf8_lossy(&render.stderr)
    );
    let panels = dash["panels"].as_array().expect("panels").iter().filter(|p| p["type"] != "row").count();
    let pngs: Vec<PathBuf> = std::fs::read_dir(&out)
        .expect("png dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "png"))
        .collect();
    assert_eq!(pngs.len(), panels, "one image per panel: {pngs:?}");
    for p in &pngs {
        let bytes = std::fs::read(p).expect("png");
        assert!(bytes.len() > 2000 && bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{} is not a drawn PNG", p.display());
    }
}
