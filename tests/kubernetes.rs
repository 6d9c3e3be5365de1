//! Issue #16: the Kubernetes manifests of `examples/kubernetes/`, checked offline.
//!
//! * every object validates against the Kubernetes schemas, unknown fields refused
//!   (`kubernetes-validate --strict`, whose schemas ship in the package, installed by
//!   `scripts/setup.sh`);
//! * the ConfigMap's `minibatchd.toml` is a valid minibatchd configuration (the daemon's own
//!   loader) whose socket lies in the directory the DaemonSet and the trainers mount from the
//!   host, whose metrics port is the one probed for liveness and scraped, and whose
//!   `memory_limit_bytes` plus the documented overhead fits the container's memory request;
//! * credentials come from a Secret, not from the configuration.

mod support;

use std::process::Command;

use support::daemon::python;
use support::package_root;

/// The manifests as JSON documents (PyYAML, which the validator depends on).
fn documents(file: &str) -> Vec<serde_json::Value> {
    let path = package_root().join("examples/kubernetes").join(file);
    let out = Command::new(python())
        .args(["-c", "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))"])
        .arg(&path)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

fn kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

/// "9Gi" and the like, in bytes.
fn quantity(q: &str) -> u64 {
    let (digits, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = digits.parse().expect("a quantity");
    n << match unit {
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "" => 0,
        other => panic!("unit {other}"),
    }
}

#[test]
fn the_manifests_validate_against_the_kubernetes_schemas() {
    let py = std::path::PathBuf::from(python());
    let validate = py.parent().expect("venv bin").join("kubernetes-validate");
    assert!(validate.exists(), "{} is missing: run scripts/setup.sh", validate.display());
    let dir = package_root().join("examples/kubernetes");
    let out = Command::new(&validate)
        .arg("--strict")
        .arg(dir.join("minibatchd.yaml"))
        .arg(dir.join("trainer-job.yaml"))
        .output()
        .expect("kubernetes-validate");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches(" passed for resource ").count(), 6, "{text}");
}

#[test]
fn the_daemonset_and_its_configuration_agree() {
    let docs = documents("minibatchd.yaml");
    let toml = kind(&docs, "ConfigMap")["data"]["minibatchd.toml"].as_str().expect("minibatchd.toml");
    let config =
        minibatchd::Config::from_toml_str(toml, std::path::Path::new("/etc/minibatchd")).expect("a valid config");
    let d = &config.daemon;
    assert!(config.datasets.values().all(|ds| ds.sources.iter().flat_map(|s| &s.files).all(|f| f.starts_with("s3:"))));
    assert!(!toml.contains("AWS_") && !toml.to_lowercase().contains("secret"), "credentials in the ConfigMap");
    let ds = kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"];
    let c = &pod["spec"]["containers"][0];
    // The socket's directory is the hostPath the trainers mount.
    let volume_of = |mount: &str| -> String {
        let name =
            c["volumeMounts"].as_array().expect("mounts").iter().find(|m| m["mountPath"] == mount).expect("mount")
                ["name"]
                .as_str()
                .expect("name")
                .to_owned();
        let v = pod["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .find(|v| v["name"] == name.as_str())
            .expect("volume");
        v["hostPath"]["path"].as_str().unwrap_or_default().to_owned()
    };
    let socket_dir = d.socket.parent().expect("socket dir").to_str().expect("utf-8");
    assert_eq!(volume_of(socket_dir), socket_dir, "the socket directory is shared from the host");
    let trainer = documents("trainer-job.yaml");
    let job = kind(&trainer, "Job");
    let tv = &job["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"];
    assert_eq!(tv.as_str(), Some(socket_dir), "the trainers mount the same host directory");
    let env = job["spec"]["template"]["spec"]["containers"][0]["env"].as_array().expect("env");
    assert!(env.iter().any(|e| e["name"] == "MINIBATCHD_SOCKET" && e["value"] == d.socket.to_str().expect("utf-8")));
    // The metrics port: liveness and readiness on /healthz, scraped by Prometheus.
    let port: u16 = d.metrics_listen.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port");
    assert_eq!(c["ports"][0]["containerPort"], port);
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(pod["metadata"]["annotations"]["prometheus.io/port"], port.to_string());
    assert_eq!(pod["metadata"]["annotations"]["prometheus.io/scrape"], "true");
    // Memory: the request covers memory_limit_bytes + the documented 64 MiB overhead.
    let request = quantity(c["resources"]["requests"]["memory"].as_str().expect("request"));
    let limit = quantity(c["resources"]["limits"]["memory"].as_str().expect("limit"));
    assert!(request >= d.memory_limit_bytes + (64 << 20), "request {request} < memory_limit_bytes + 64 MiB");
    assert!(limit >= request);
    // Credentials from the Secret.
    assert_eq!(c["envFrom"][0]["secretRef"]["name"], kind(&docs, "Secret")["metadata"]["name"]);
    // The object cache directory is on a volume, not the container's read-only root.
    assert!(!volume_of("/var/cache/minibatchd").is_empty());
    assert!(d.objects.cache_dir.starts_with("/var/cache/minibatchd"));
}
