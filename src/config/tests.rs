use super::*;
use minibatchd_engine::sampling::Window;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str(text, Path::new("/cfg"))
}

const GOOD: &str = r#"
[daemon]
socket = "run/mbd.sock"
state_dir = "/var/lib/minibatchd"

[datasets.train]
format = "ctf"
files = ["data/train.ctf"]
chunk_size_bytes = 1024
max_errors = 3

[datasets.train.streams.features]
alias = "F"
dim = 4
format = "dense"

[datasets.train.streams.labels]
alias = "L"
dim = 10
format = "sparse"
defines_mb_size = true

[datasets.train.sampling]
window_samples = 100
seed = 7
"#;

#[test]
fn a_good_config_resolves_relative_paths_and_defaults() {
    let c = parse(GOOD).expect("valid");
    let d = c.dataset("train").expect("train");
    assert_eq!(c.daemon.socket, PathBuf::from("/cfg/run/mbd.sock"));
    assert_eq!(d.sources[0].files, vec![PathBuf::from("/cfg/data/train.ctf")]);
    assert_eq!(d.chunk_size_bytes, 1024);
    assert_eq!(d.sampling.window, Window::Samples(100));
    assert_eq!(d.sampling.seed, 7);
    assert!(d.sampling.randomize);
    assert_eq!(d.streams().filter(|s| s.defines_mb_size).count(), 1);
}

#[test]
fn every_error_is_reported_with_its_key_path() {
    let text = r#"
[daemon]
socket = 5
bogus = 1
[datasets.train]
format = "ctff"
files = ["x"]
max_errors = -1
[datasets.train.streams.f]
dim = 0
format = "dense"
colour = "red"
[datasets.train.streams.g]
alias = "f"
dim = 3
format = "thick"
[datasets.train.sampling]
window_chunks = 1
window_samples = 2
"#;
    let Err(ConfigError::Invalid { issues, .. }) = parse(text) else { panic!("expected invalid") };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    for expected in [
        "daemon.bogus",
        "daemon.socket",
        "datasets.train.format",
        "datasets.train.max_errors",
        "datasets.train.sampling",
        "datasets.train.streams.f.colour",
        "datasets.train.streams.f.dim",
        "datasets.train.streams.g.format",
    ] {
        assert!(paths.contains(&expected), "{expected} missing from {paths:?}");
    }
}

#[test]
fn a_misspelt_key_is_told_the_key_it_likely_meant() {
    let text = GOOD
        .replace("state_dir =", "state_dri =")
        .replace("max_errors =", "max_error =")
        .replace("seed = 7", "seed = 7\nbogus = 1");
    let Err(ConfigError::Invalid { issues, .. }) = parse(&text) else { panic!("expected invalid") };
    let message = |path: &str| {
        issues
            .iter()
            .find(|i| i.path == path)
            .map_or_else(|| panic!("{path} not reported: {issues:?}"), |i| i.message.clone())
    };
    assert_eq!(message("daemon.state_dri"), "unknown key; did you mean `state_dir`?");
    assert_eq!(message("datasets.train.max_error"), "unknown key; did you mean `max_errors`?");
    assert_eq!(message("datasets.train.sampling.bogus"), "unknown key", "nothing near enough to suggest");
}

#[test]
fn two_defining_streams_and_duplicate_aliases_are_errors() {
    let text = r#"
[datasets.d]
format = "ctf"
files = ["x"]
[datasets.d.streams.a]
alias = "x"
dim = 1
format = "dense"
defines_mb_size = true
[datasets.d.streams.b]
alias = "x"
dim = 1
format = "dense"
defines_mb_size = true
"#;
    let e = parse(text).expect_err("invalid").to_string();
    assert!(e.contains("only a single stream is allowed to define the minibatch size"), "{e}");
    assert!(e.contains("already mapped"), "{e}");
}

/// Found by a probe: "every problem is reported" missed a duplicate alias beside a stream's bad
/// `dim`, and a mixture's weight count beside a wrong dataset name (and the weights' own problems
/// beside a wrong count).
#[test]
fn problems_beside_others_are_reported_too() {
    let text = GOOD.replace("alias = \"L\"", "alias = \"F\"").replace("dim = 4", "dim = 0").replace(
        "[datasets.train.sampling]",
        "[mixtures.m]\ndatasets = [\"train\", \"nope\"]\nweights = [1, -2, 3]\n\n[datasets.train.sampling]",
    );
    let Err(ConfigError::Invalid { issues, .. }) = parse(&text) else { panic!("expected invalid") };
    let reported = |path: &str, what: &str| issues.iter().any(|i| i.path == path && i.message.contains(what));
    assert!(reported("datasets.train.streams.features.dim", "out of range"), "{issues:?}");
    assert!(
        reported("datasets.train.streams.labels.alias", "alias 'F' is already mapped to stream 'features'"),
        "{issues:?}"
    );
    assert!(reported("mixtures.m.datasets[1]", "no dataset 'nope'"), "{issues:?}");
    assert!(reported("mixtures.m.weights", "3 weights for 2 datasets"), "{issues:?}");
    assert!(reported("mixtures.m.weights", "weight 1 is -2"), "{issues:?}");
}

#[test]
fn sparse_dim_is_bounded_by_int32() {
    let text = r#"
[datasets.d]
format = "ctf"
files = ["x"]
[datasets.d.streams.s]
dim = 3000000000
format = "sparse"
"#;
    assert!(parse(text).expect_err("invalid").to_string().contains("streams.s.dim"));
}

#[test]
fn several_sources_are_an_array_of_tables() {
    let text = r#"
[datasets.d]
format = "ctf"
[[datasets.d.sources]]
files = ["a.ctf"]
[datasets.d.sources.streams.x]
dim = 2
format = "dense"
[[datasets.d.sources]]
files = ["b.ctf"]
skip_sequence_ids = true
[datasets.d.sources.streams.y]
dim = 3
format = "sparse"
"#;
    let c = parse(text).expect("valid");
    let d = c.dataset("d").expect("d");
    assert_eq!(d.sources.len(), 2);
    assert!(d.sources[1].skip_sequence_ids);
    assert_eq!(d.streams().map(|s| s.name.as_str()).collect::<Vec<_>>(), vec!["x", "y"]);
}

#[test]
fn env_overrides_apply_on_top_of_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("c.toml");
    std::fs::write(&p, GOOD).expect("write");
    // A variable name unique to this test, so parallel tests are not affected.
    std::env::set_var("MINIBATCHD__DATASETS__TRAIN__MAX_ERRORS", "11");
    let c = Config::load(&p);
    std::env::remove_var("MINIBATCHD__DATASETS__TRAIN__MAX_ERRORS");
    assert_eq!(c.expect("valid").dataset("train").expect("train").max_errors, 11);
}

/// Regression: config 0.14 lower-cased every key while merging, so a stream named `A` became
/// `a` and its default alias no longer matched `|A` in the data.
#[test]
fn stream_names_keep_their_case() {
    let text =
        "[datasets.d]\nformat = \"ctf\"\nfiles = [\"x\"]\n[datasets.d.streams.Features]\ndim = 1\nformat = \"dense\"\n";
    let c = parse(text).expect("valid");
    let s = c.dataset("d").expect("d").streams().next().expect("a stream").clone();
    assert_eq!((s.name.as_str(), s.alias.as_str()), ("Features", "Features"));
}

fn deepx(format: &str, extra: &str) -> Result<DeepxOptions, String> {
    let text = format!("[datasets.d]\nformat = \"{format}\"\nfiles = [\"x\"]\n{extra}\n");
    parse(&text).map(|c| c.dataset("d").expect("d").deepx.clone().expect("deepx options")).map_err(|e| e.to_string())
}

#[test]
fn deepx_keys_and_the_instance_reader_config_string() {
    let o = deepx("libsvm", "label_size = 2\nw = true\ninstance_reader_config = \"batch=32;uuid=1;;\"").expect("valid");
    assert_eq!((o.label_size, o.w, o.uuid, o.batch), (2, true, true, Some(32)));
    // deepx's splitting: empty parts are dropped, so `batch==7` is batch 7; aliases.
    let o = deepx("uch", "instance_reader_config = \"batch_size==7;has_w=5;history_item_size=20\"").expect("valid");
    assert_eq!((o.batch, o.w, o.x_hist_item_size), (Some(7), true, Some(20)));
    let o = deepx("libsvm_ex", "x_size = 3\nw = 1").expect("valid");
    assert_eq!((o.x_size, o.w, o.label_size), (Some(3), true, 1));
}

#[test]
fn deepx_validation_follows_deepx_rules() {
    let e = deepx("libsvm_ex", "").expect_err("x_size required");
    assert!(e.contains("datasets.d.x_size: missing"), "{e}");
    let e = deepx("uch", "").expect_err("x_hist_item_size required");
    assert!(e.contains("datasets.d.x_hist_item_size: missing"), "{e}");
    let e = deepx("libsvm", "x_size = 2\nlabel_size = 33").expect_err("limits");
    assert!(e.contains("datasets.d.x_size: exists for format libsvm_ex only"), "{e}");
    assert!(e.contains("datasets.d.label_size: 33 is out of range: expected 1..=32"), "{e}");
    // A size out of range is that, not also missing (a probe saw both for `x_size = 129`).
    for (format, extra) in [
        ("libsvm_ex", "x_size = 129"),
        ("libsvm_ex", "instance_reader_config = \"x_size=0\""),
        ("uch", "x_hist_item_size = 0"),
        ("uch", "instance_reader_config = \"hist_item_size=129\""),
    ] {
        let e = deepx(format, extra).expect_err(extra);
        assert!(e.contains("is out of range: expected 1..=128") && !e.contains("missing"), "{extra}: {e}");
    }
    for (bad, needle) in [
        ("batch=", "is not key=value"),
        ("batch=3=2", "is not key=value"),
        ("batch=0", "expected 1..="),
        ("batch=32abc", "must be an integer"),
        (" batch=32", "unexpected key ' batch'"),
        ("x_size=2", "unexpected key 'x_size'"),
        ("label_size=40", "expected 1..=32"),
    ] {
        let e = deepx("libsvm", &format!("instance_reader_config = \"{bad}\"")).expect_err(bad);
        assert!(e.contains("datasets.d.instance_reader_config") && e.contains(needle), "{bad}: {e}");
    }
}

#[test]
fn deepx_key_given_twice_must_agree() {
    let e = deepx("libsvm", "label_size = 2\ninstance_reader_config = \"label_size=3\"").expect_err("conflict");
    assert!(e.contains("datasets.d.label_size") && e.contains("instance_reader_config"), "{e}");
    assert!(deepx("libsvm", "label_size = 2\ninstance_reader_config = \"label_size=2\"").is_ok());
}

#[test]
fn svmlight_options_belong_to_libsvm() {
    let o = deepx("libsvm", "comments = true\nqid = true\nfeature_index_base = 1").expect("valid");
    assert!(o.comments && o.qid && o.feature_index_base == 1);
    let e = deepx("uch", "x_hist_item_size = 2\ncomments = true\nfeature_index_base = 1").expect_err("libsvm only");
    assert!(e.contains("datasets.d.comments: exists for format libsvm only"), "{e}");
    assert!(e.contains("datasets.d.feature_index_base: exists for format libsvm only"), "{e}");
    assert!(deepx("libsvm", "feature_index_base = 2").expect_err("0 or 1").contains("expected 0..=1"));
}

#[test]
fn deepx_datasets_take_no_streams_or_sources() {
    let e = deepx("libsvm", "[datasets.d.streams.f]\ndim = 1\nformat = \"dense\"").expect_err("streams");
    assert!(e.contains("streams are fixed by the deepx formats"), "{e}");
    for value in ["true", "false"] {
        let e = deepx("uch", &format!("x_hist_item_size = 2\nskip_sequence_ids = {value}")).expect_err("ctf only");
        assert!(e.contains("datasets.d.skip_sequence_ids: exists for format ctf only"), "{e}");
    }
}

/// `conf/minibatchd.toml` documents every key with its default: it must stay a valid config, and
/// the commented-out several-sources example in it must be valid once uncommented.
#[test]
fn the_documented_reference_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/minibatchd.toml");
    let c = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.dataset("train").is_ok());
    let text = std::fs::read_to_string(&path).expect("read");
    let example = text.split_once("# [datasets.joined]").map(|(_, rest)| format!("# [datasets.joined]{rest}"));
    if let Some(example) = example {
        // The example runs up to the next blank line.
        let uncommented: String = example
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let c = Config::from_toml_str(&uncommented, Path::new("/")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.dataset("joined").expect("joined").sources.len(), 2);
    }
}

/// Regression: raising the default ring depth made the example's default session need more ring
/// memory than the example's `memory_limit_bytes` leaves for rings (three quarters; a quarter
/// stays with the chunk cache), so `scripts/run-example.sh` was refused with `resource_exhausted`.
#[test]
fn the_example_configs_default_session_fits_its_memory_budget() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/example.toml");
    let c = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let ring = c.daemon.ring_slots as u64 * c.daemon.slot_size_bytes;
    assert!(ring <= c.daemon.memory_limit_bytes / 4 * 3, "ring {ring} vs limit {}", c.daemon.memory_limit_bytes);
}

/// Issue #15: the limits on decompressing `.gz` inputs are `[daemon]` keys, handed to every
/// dataset (the engine takes them from its `DatasetConfig`).
#[test]
fn inflation_limits_are_daemon_keys_given_to_every_dataset() {
    let c = parse(GOOD).expect("valid");
    assert_eq!(c.dataset("train").expect("train").inflate, InflateLimits::default());
    assert_eq!(InflateLimits::default(), InflateLimits { max_bytes: 64 << 30, max_ratio: DEFAULT_MAX_INFLATE_RATIO });
    let text = GOOD.replace("[daemon]\n", "[daemon]\nmax_inflated_bytes = 1000\nmax_inflate_ratio = 20\n");
    let c = parse(&text).expect("valid");
    assert_eq!(c.dataset("train").expect("train").inflate, InflateLimits { max_bytes: 1000, max_ratio: 20 });
    let bad = GOOD.replace("[daemon]\n", "[daemon]\nmax_inflated_bytes = 0\nmax_inflate_ratio = \"lots\"\n");
    let Err(ConfigError::Invalid { issues, .. }) = parse(&bad) else { panic!("expected invalid") };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(paths, vec!["daemon.max_inflate_ratio", "daemon.max_inflated_bytes"], "{issues:?}");
}

/// Huge pages for parsed chunks: on unless the file says `huge_pages = false`; anything but a
/// boolean is an error naming the key.
#[test]
fn huge_pages_is_a_boolean_on_by_default() {
    assert!(parse(GOOD).expect("valid").daemon.huge_pages);
    let off = GOOD.replace("[daemon]\n", "[daemon]\nhuge_pages = false\n");
    assert!(!parse(&off).expect("valid").daemon.huge_pages);
    let bad = GOOD.replace("[daemon]\n", "[daemon]\nhuge_pages = \"auto\"\n");
    let Err(ConfigError::Invalid { issues, .. }) = parse(&bad) else { panic!("expected invalid") };
    assert_eq!(issues.iter().map(|i| i.path.as_str()).collect::<Vec<_>>(), vec!["daemon.huge_pages"], "{issues:?}");
}

/// `object_request_timeout_secs`: 30 by default, at least 1 (a request with no time to answer
/// would fail every time), at most an hour; out of range is an error naming the key.
#[test]
fn the_object_request_timeout_defaults_to_30_and_is_bounded() {
    assert_eq!(parse(GOOD).expect("valid").daemon.objects.request_timeout_secs, 30);
    let set = GOOD.replace("[daemon]\n", "[daemon]\nobject_request_timeout_secs = 5\n");
    assert_eq!(parse(&set).expect("valid").daemon.objects.request_timeout_secs, 5);
    for bad in ["0", "3601", "\"30s\""] {
        let text = GOOD.replace("[daemon]\n", &format!("[daemon]\nobject_request_timeout_secs = {bad}\n"));
        let Err(ConfigError::Invalid { issues, .. }) = parse(&text) else { panic!("{bad}: expected invalid") };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(paths, vec!["daemon.object_request_timeout_secs"], "{bad}: {issues:?}");
    }
}

#[test]
fn validate_refuses_what_run_would_refuse() {
    let long = format!("/tmp/{}/mbd.sock", "d".repeat(120));
    let text = GOOD
        .replace(r#"socket = "run/mbd.sock""#, &format!("socket = \"{long}\""))
        .replace(r#"state_dir = "/var/lib/minibatchd""#, r#"state_dir = "/dev/zero""#)
        .replace("dim = 4", r#"dim = "4""#);
    let Err(ConfigError::Invalid { issues, .. }) = parse(&text) else { panic!("must be invalid") };
    let find = |path: &str| issues.iter().find(|i| i.path == path).map(|i| i.message.clone());
    assert!(find("daemon.socket").is_some_and(|m| m.contains("under 108 bytes")), "{issues:?}");
    // A socket path taken by something that is not a socket (run would refuse to bind there).
    let text = GOOD.replace(r#"socket = "run/mbd.sock""#, r#"socket = "/dev/zero""#);
    let Err(ConfigError::Invalid { issues, .. }) = parse(&text) else { panic!("a socket on /dev/zero") };
    assert!(
        issues.iter().any(|i| i.path == "daemon.socket" && i.message.contains("/dev/zero exists and is not a socket")),
        "{issues:?}"
    );
    assert!(find("daemon.state_dir").is_some_and(|m| m.contains("not a directory")), "{issues:?}");
    assert!(find("datasets.train.streams.features.dim").is_some_and(|m| m.contains("the string '4'")), "{issues:?}");
    // Under a file, a directory cannot be made (found by a probe: validate passed it).
    let text = GOOD.replace(r#"state_dir = "/var/lib/minibatchd""#, r#"state_dir = "/dev/zero/state""#);
    let Err(ConfigError::Invalid { issues, .. }) = parse(&text) else { panic!("a state_dir under a file") };
    assert!(
        issues.iter().any(|i| i.path == "daemon.state_dir" && i.message.contains("/dev/zero is not a directory")),
        "{issues:?}"
    );
}

/// Found by the `config_load` fuzz target (#15 acceptance 5): the `config` crate reads `[N]` in a
/// key as an array index, so a 17-byte file naming `t[055777777]` built a 56-million-element
/// array (7 GB, 30 s in `validate`). Such keys, and override names, are refused first.
#[test]
fn a_key_the_config_crate_would_read_as_an_index_is_refused_before_it_does() {
    let Err(ConfigError::Invalid { issues, .. }) = parse("[\"t[055777777]\"]\n") else { panic!("must be invalid") };
    assert_eq!(issues[0].path, "t[055777777]", "{issues:?}");
    assert!(issues[0].message.contains("may not contain"), "{issues:?}");
    let nested = GOOD.replace("[datasets.train.streams.features]", "[datasets.train.streams.\"f[9999999]\"]");
    let Err(ConfigError::Invalid { issues, .. }) = parse(&nested) else { panic!("must be invalid") };
    assert!(issues.iter().any(|i| i.path == "datasets.train.streams.f[9999999]"), "{issues:?}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c.toml");
    std::fs::write(&file, GOOD).expect("write");
    let env = ["PATH".into(), "MINIBATCHD__DATASETS__TRAIN__X[99999999]".into()];
    let Err(ConfigError::Invalid { issues, .. }) = check_keys(&file, GOOD, env.into_iter()) else {
        panic!("an override name with an index must be refused")
    };
    assert_eq!(issues[0].path, "$MINIBATCHD__DATASETS__TRAIN__X[99999999]", "{issues:?}");
}

/// Found by a probe: a dataset named "" or holding a newline was accepted (and served, its name
/// breaking log lines and `validate`'s summary). An empty key or one with a control character is
/// refused with its path.
#[test]
fn an_empty_key_or_one_with_control_characters_is_refused() {
    for (name, path) in [("\"\"", "datasets."), ("\"a\\nb\"", "datasets.a\\nb"), ("\"t\\u0007\"", "datasets.t\\u{7}")] {
        let text = GOOD.replace("[datasets.train]", &format!("[datasets.{name}]"));
        let text = text.replace("[datasets.train.", &format!("[datasets.{name}."));
        let Err(ConfigError::Invalid { issues, .. }) = parse(&text) else { panic!("{name} must be refused") };
        assert!(
            issues.iter().any(|i| i.path == path && i.message.contains("may not be empty or hold control")),
            "{name}: {issues:?}"
        );
    }
}

/// Found by a probe: `MINIBATCHD__=5` was "- unknown key" (no path, no variable), a name with an
/// empty part a key named "", and a name that is no UTF-8 was ignored unsaid. Each is refused,
/// naming the variable.
#[test]
fn an_override_name_with_an_empty_part_or_not_utf8_is_refused_naming_it() {
    use std::os::unix::ffi::OsStringExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c.toml");
    std::fs::write(&file, GOOD).expect("write");
    let mut bad = b"MINIBATCHD__DAEMON__".to_vec();
    bad.push(0xff);
    let names: Vec<std::ffi::OsString> = vec![
        "MINIBATCHD__".into(),
        "MINIBATCHD____DAEMON".into(),
        "MINIBATCHD__DAEMON__".into(),
        std::ffi::OsString::from_vec(bad),
        "MINIBATCHD__DAEMON__MEMORY_LIMIT_BYTES".into(),
        "PATH".into(),
    ];
    let Err(ConfigError::Invalid { issues, .. }) = check_keys(&file, GOOD, names.into_iter()) else {
        panic!("must be refused")
    };
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(paths.len(), 4, "{issues:?}");
    assert_eq!(&paths[..3], ["$MINIBATCHD__", "$MINIBATCHD____DAEMON", "$MINIBATCHD__DAEMON__"]);
    assert!(issues[3].message.contains("UTF-8"), "{issues:?}");
}

/// A value too large for any number type (5,000 digits) was reported without a place ("number
/// too large to fit in target type"): it is now named by line, column and byte offset.
#[test]
fn a_number_too_large_to_read_is_named_with_its_place() {
    let text = GOOD.replace("[daemon]\n", &format!("[daemon]\nmemory_limit_bytes = {}\n", "9".repeat(5000)));
    let Err(ConfigError::Load { message, .. }) = parse(&text) else { panic!("must be refused") };
    assert!(message.starts_with("line 3, column 22 (byte offset 31): not valid TOML:"), "{message}");
    assert!(message.contains("overflowed"), "{message}");
    assert!(message.len() < 200, "one line, without the 5,000 digits: {message}");
}

/// Issue 18: the log showed the socket as `conf/../target/example/minibatchd.sock`. Relative paths
/// of a config file resolve against its directory made canonical, leading `..` applied; a `..`
/// after a named component stays (that component may be a symbolic link).
#[test]
fn relative_paths_resolve_without_leading_dot_dot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("canonical");
    std::fs::create_dir_all(root.join("conf")).expect("mkdir");
    let path = root.join("conf/c.toml");
    std::fs::write(
        &path,
        "[daemon]\nsocket = \"../run/x.sock\"\nstate_dir = \"./../state/a/../b\"\n[datasets.t]\nformat = \"ctf\"\nfiles = [\"data.ctf\"]\n[datasets.t.streams.f]\ndim = 1\nformat = \"dense\"\n",
    )
    .expect("write");
    // Loaded through a path with `..` in it, from another directory.
    let c = Config::load(&root.join("conf/../conf/c.toml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.daemon.socket, root.join("run/x.sock"));
    assert_eq!(c.daemon.state_dir, root.join("state/a/../b"), "a .. after a name is kept");
    assert_eq!(c.dataset("t").expect("t").sources[0].files, [root.join("conf/data.ctf")]);
}

/// Found by a hostile probe: a configuration replaced by a link to `/dev/zero` grew the daemon
/// to 6 GB at the next SIGHUP, and a FIFO blocked the reload for good. Only a regular file of at
/// most `MAX_CONFIG_BYTES` is read.
#[test]
fn only_a_regular_file_of_bounded_size_is_read_as_a_configuration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let zero = dir.path().join("zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
    let fifo = dir.path().join("fifo.toml");
    rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR).expect("mkfifo");
    let large = dir.path().join("large.toml");
    let file = std::fs::File::create(&large).expect("create");
    file.set_len(MAX_CONFIG_BYTES + 1).expect("set_len");
    for (path, want) in [(&zero, "a device"), (&fifo, "a FIFO"), (&large, "larger than")] {
        match Config::load(path) {
            Err(ConfigError::Load { message, .. }) => assert!(message.contains(want), "{}: {message}", path.display()),
            other => panic!("{}: {:?}", path.display(), other.map(|_| ())),
        }
    }
}

/// Found by a probe: an integer default the precision cannot hold was accepted, then every record
/// that used it failed as malformed data. It is refused at its key, saying what holds it.
#[test]
fn an_integer_default_the_precision_cannot_hold_is_refused() {
    let tfrecord = |precision: &str, default: &str| {
        format!(
            "[datasets.t]\nformat = \"tfrecord\"\nfiles = [\"x\"]\n{precision}\n[datasets.t.streams.label]\ndtype = \"int64\"\nformat = \"dense\"\ndim = 1\ndefault = {default}\n"
        )
    };
    let csv = |precision: &str, default: &str| {
        format!(
            "[datasets.c]\nformat = \"csv\"\nfiles = [\"x\"]\ncolumns = 2\n{precision}\n[datasets.c.streams.n]\ncolumns = [1]\ndtype = \"int32\"\ndefault = {default}\n"
        )
    };
    for (text, key) in [
        (tfrecord("", "16777217"), "datasets.t.streams.label.default"),
        (csv("", "16777217"), "datasets.c.streams.n.default"),
    ] {
        let e = parse(&text).expect_err("refused").to_string();
        assert!(e.contains(key) && e.contains("not exact") && e.contains("float64"), "{e}");
    }
    // Past 2^53 no precision holds it: read as a float it was rounded and served as 2^53.
    let e = parse(&tfrecord("precision = \"float64\"", "9007199254740993")).expect_err("refused").to_string();
    assert!(e.contains("datasets.t.streams.label.default") && e.contains("not exact"), "{e}");
    for text in [
        tfrecord("", "16777216"),
        tfrecord("precision = \"float64\"", "16777217"),
        csv("", "-16777216"),
        csv("precision = \"float64\"", "2147483647"),
    ] {
        assert!(parse(&text).is_ok(), "{text}: {:?}", parse(&text).err().map(|e| e.to_string()));
    }
}

#[test]
fn an_issue_in_a_table_the_environment_sets_names_the_variable() {
    let mut issues = vec![
        ConfigIssue { path: "datasets.train.files".into(), message: "missing".into() },
        ConfigIssue { path: "datasets.trainer.files".into(), message: "missing".into() },
    ];
    let env = ["MINIBATCHD__DATASETS__TRAIN__SAMPLING__SEED".to_owned(), "MINIBATCHD__DAEMON__RING_SLOTS".into()];
    let file = serde_json::json!({"daemon": {"memory_limit_bytes": 0}, "datasets": {"other": {}}});
    name_environment(&mut issues, &env, Some(&file));
    assert!(issues[0].message.contains("MINIBATCHD__DATASETS__TRAIN__SAMPLING__SEED"), "{}", issues[0].message);
    assert_eq!(issues[1].message, "missing", "another table");
    // A table the file holds is not blamed on the environment.
    let mut issues = vec![ConfigIssue { path: "daemon.memory_limit_bytes".into(), message: "out of range".into() }];
    name_environment(&mut issues, &env, Some(&file));
    assert_eq!(issues[0].message, "out of range");
}

/// Found by a probe: a `state_dir` inside a dataset's directory passed `validate`, and the daemon
/// then read its own checkpoint and lock as data (every `open` refused once they changed). A
/// directory or a glob that takes in `state_dir` is refused, naming the dataset; one beside it is
/// not.
#[test]
fn a_dataset_that_takes_in_state_dir_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("state")).expect("mkdir");
    let with = |files: &str, state: &Path| {
        GOOD.replace(r#"files = ["data/train.ctf"]"#, &format!("files = [\"{files}\"]"))
            .replace(r#"state_dir = "/var/lib/minibatchd""#, &format!("state_dir = \"{}\"", state.display()))
    };
    for files in [data.display().to_string(), format!("{}/**/*", data.display())] {
        let Err(ConfigError::Invalid { issues, .. }) = parse(&with(&files, &data.join("state"))) else {
            panic!("{files}: a dataset over state_dir must be refused")
        };
        assert!(
            issues.iter().any(|i| i.path == "datasets.train.files" && i.message.contains("takes in daemon.state_dir")),
            "{files}: {issues:?}"
        );
    }
    let beside = dir.path().join("state");
    parse(&with(&data.display().to_string(), &beside)).expect("a state_dir beside the data");
    parse(&with(&format!("{}/*.ctf", data.display()), &data.join("state"))).expect("a glob that leaves state_dir out");
}
