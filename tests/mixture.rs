//! Weighted mixtures of datasets through the real binary (issue 40): `validate` refuses a bad
//! `[mixtures.NAME]` naming the key; `dump --mixture --ledger` resumed from the state of any line,
//! at any world size, continues the uninterrupted run; every worker takes the same steps and each
//! slot goes to one of them; the data of each sequence is its source's; a first-sweep-end epoch
//! holds one whole sweep of the source that ended; damaged states are refused.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{parse_dump, write, BIN};

/// Two CTF datasets with the same streams (`a`: 23 lines in chunks of a few lines, randomized;
/// `b`: 7 lines in file order; a feature holds the source and the line) and a libsvm one (`c`),
/// and the mixtures of them that `mixtures` adds.
fn config(dir: &Path, mixtures: &str) -> PathBuf {
    let a = (0..23).map(|i| format!("|F {i} 0 |L {}:1\n", i % 3)).collect::<Vec<_>>().concat();
    let b = (0..7).map(|i| format!("|F {i} 1 |L {}:1\n", i % 3)).collect::<Vec<_>>().concat();
    let c = (0..11).map(|i| format!("{} {i}:1\n", i % 2)).collect::<Vec<_>>().concat();
    write(dir, "a.ctf", a);
    write(dir, "b.ctf", b);
    write(dir, "c.svm", c);
    let streams = |d: &str| {
        format!(
            "[datasets.{d}.streams.features]\nalias = \"F\"\ndim = 2\nformat = \"dense\"\n[datasets.{d}.streams.labels]\nalias = \"L\"\ndim = 3\nformat = \"sparse\"\n"
        )
    };
    write(
        dir,
        "c.toml",
        format!(
            "[daemon]\nstate_dir = \"state\"\n\
             [datasets.d]\nformat = \"ctf\"\nfiles = [\"b.ctf\"]\n\
             [datasets.d.streams.x]\nalias = \"F\"\ndim = 2\nformat = \"dense\"\n\
             [datasets.d.streams.y]\nalias = \"L\"\ndim = 3\nformat = \"sparse\"\n\
             [datasets.d.sampling]\nrandomize = false\n\
             [datasets.a]\nformat = \"ctf\"\nfiles = [\"a.ctf\"]\nchunk_size_bytes = 60\n{}\
             [datasets.a.sampling]\nwindow_chunks = 3\nseed = 5\n\
             [datasets.b]\nformat = \"ctf\"\nfiles = [\"b.ctf\"]\n{}\
             [datasets.b.sampling]\nrandomize = false\n\
             [datasets.c]\nformat = \"libsvm\"\nfiles = [\"c.svm\"]\nchunk_size_bytes = 20\n\
             {mixtures}",
            streams("a"),
            streams("b")
        ),
    )
}

const MIXTURES: &str = "[mixtures.ab]\ndatasets = [\"a\", \"b\"]\nweights = [2.5, 1]\nepoch = \"first_sweep_end\"\n\
    [[mixtures.ab.schedule]]\nfrom_step = 4\nweights = [1, 3]\n\
    [mixtures.abc]\ndatasets = [\"a\", \"b\", \"d\"]\nweights = [1, 1, 2]\nmax_samples = 60\n\
    [mixtures.abc.streams]\nfeatures = [\"features\", \"features\", \"x\"]\nlabels = [\"labels\", \"labels\", \"y\"]\n";

fn run(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN).arg("dump").arg("--config").arg(config).args(args).output().expect("run minibatchd")
}

fn lines(config: &Path, args: &[&str]) -> Vec<serde_json::Value> {
    let out = run(config, args);
    assert!(out.status.success(), "dump {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    parse_dump(&String::from_utf8_lossy(&out.stdout)).expect("JSON lines")
}

/// `[source, sweep, sequence]` of each sequence of a ledger line.
fn refs(line: &serde_json::Value) -> Vec<(u64, u64, u64)> {
    line["sequences"]
        .as_array()
        .expect("sequences")
        .iter()
        .map(|r| (r[0].as_u64().expect("source"), r[1].as_u64().expect("sweep"), r[2].as_u64().expect("index")))
        .collect()
}

#[test]
fn a_ledger_resumed_from_any_line_at_any_world_size_continues_the_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let c = config(dir.path(), MIXTURES);
    for mixture in ["ab", "abc"] {
        let whole = lines(&c, &["--mixture", mixture, "--minibatch-sizes", "3,5,2", "--ledger"]);
        assert!(whole.len() > 3, "{mixture}: {} minibatches", whole.len());
        for cut in 0..whole.len() {
            let state = whole[cut]["state"].to_string();
            let rest: Vec<(u64, u64, u64)> = whole[cut + 1..].iter().flat_map(refs).collect();
            let sizes = ["3,5,2", "5,2,3", "2,3,5"][(cut + 1) % 3];
            for workers in [1usize, 2, 3] {
                let by_rank: Vec<Vec<serde_json::Value>> = (0..workers)
                    .map(|rank| {
                        let (w, r) = (workers.to_string(), rank.to_string());
                        let args = [
                            "--mixture",
                            mixture,
                            "--minibatch-sizes",
                            sizes,
                            "--ledger",
                            "--workers",
                            &w,
                            "--rank",
                            &r,
                            "--restore-state",
                            &state,
                        ];
                        lines(&c, &args)
                    })
                    .collect();
                // Every worker takes the same steps; slot g after the cut is worker g mod W's.
                let mut dealt = Vec::new();
                for step in 0..by_rank[0].len() {
                    let total = by_rank[0][step]["state"]["slots"].as_u64().expect("slots")
                        - if step == 0 {
                            whole[cut]["state"]["slots"].as_u64().expect("slots")
                        } else {
                            by_rank[0][step - 1]["state"]["slots"].as_u64().expect("slots")
                        };
                    let first = by_rank[0][step]["state"]["slots"].as_u64().expect("slots") - total;
                    let mut next = vec![0usize; workers];
                    for g in first..first + total {
                        let owner = usize::try_from(g % workers as u64).expect("rank");
                        dealt.push(refs(&by_rank[owner][step])[next[owner]]);
                        next[owner] += 1;
                    }
                    for rank in 0..workers {
                        assert_eq!(
                            by_rank[rank][step]["state"], by_rank[0][step]["state"],
                            "the state is the same on every worker"
                        );
                        assert_eq!(next[rank], refs(&by_rank[rank][step]).len());
                    }
                }
                assert_eq!(by_rank[0].len(), whole.len() - cut - 1, "{mixture}, cut {cut}, {workers} workers: steps");
                assert_eq!(dealt, rest, "{mixture}, cut {cut}, {workers} workers");
            }
        }
    }
}

#[test]
fn each_sequence_carries_its_sources_data_and_the_first_sweep_end_holds_one_whole_sweep() {
    let dir = tempfile::tempdir().expect("temp dir");
    let c = config(dir.path(), MIXTURES);
    let data = lines(&c, &["--mixture", "ab", "--minibatch-size", "4"]);
    let ledger = lines(&c, &["--mixture", "ab", "--minibatch-size", "4", "--ledger"]);
    assert_eq!(data.len(), ledger.len());
    let mut seen = [vec![0u32; 23], vec![0u32; 7]];
    for (d, l) in data.iter().zip(&ledger) {
        assert_eq!(d["fingerprint"], l["fingerprint"]);
        assert_eq!(d["state"], l["state"]);
        let features = d["streams"]["features"]["sequences"].as_array().expect("sequences");
        let r = refs(l);
        assert_eq!(features.len(), r.len());
        for ((source, _, index), f) in r.iter().zip(features) {
            // Line i of source s holds the features [i, s].
            assert_eq!(f[0][0].as_u64(), None, "values print as floats: {f}");
            assert_eq!(f[0][0].as_f64().map(|x| x.to_string()), Some(index.to_string()));
            assert_eq!(f[0][1].as_f64().map(|x| x.to_string()), Some(source.to_string()));
            seen[usize::try_from(*source).expect("source")][usize::try_from(*index).expect("index")] += 1;
        }
        assert_eq!(d["sources"], serde_json::json!(r.iter().map(|x| x.0).collect::<Vec<_>>()));
    }
    let last = ledger.last().expect("a minibatch");
    let ended = last["sweeps_ended"].as_array().expect("sweeps_ended");
    assert_eq!(ended.len(), 1, "one source ends the epoch: {last}");
    assert!(ledger[..ledger.len() - 1].iter().all(|l| l["sweeps_ended"] == serde_json::json!([])));
    let ended = usize::try_from(ended[0].as_u64().expect("source")).expect("source");
    assert!(seen[ended].iter().all(|&n| n == 1), "source {ended}: {:?}", seen[ended]);
    assert!(seen[1 - ended].iter().all(|&n| n <= 1), "no sequence twice within a sweep");
    assert_eq!(last["state"]["ended"], true);
}

#[test]
fn bad_mixtures_are_refused_naming_the_key() {
    let cases = [
        ("[mixtures.m]\ndatasets = [\"a\", \"zz\"]\nweights = [1, 1]\n", "mixtures.m.datasets[1]", "no dataset 'zz'"),
        ("[mixtures.m]\ndatasets = [\"a\", \"a\"]\nweights = [1, 1]\n", "mixtures.m.datasets[1]", "listed twice"),
        ("[mixtures.m]\ndatasets = []\nweights = []\n", "mixtures.m.datasets", "expected 1..=256"),
        ("[mixtures.m]\ndatasets = [\"a\", \"b\"]\nweights = [1]\n", "mixtures.m.weights", "1 weights for 2 datasets"),
        ("[mixtures.m]\ndatasets = [\"a\", \"b\"]\nweights = [1, -2]\n", "mixtures.m.weights", "weight 1 is -2"),
        ("[mixtures.m]\ndatasets = [\"a\", \"b\"]\nweights = [0, 0]\n", "mixtures.m.weights", "at least one weight must be positive"),
        ("[mixtures.m]\ndatasets = [\"a\", \"b\"]\nweights = [1, \"x\"]\n", "mixtures.m.weights[1]", "expected a number"),
        ("[mixtures.m]\ndatasets = [\"a\"]\n", "mixtures.m.weights", "required"),
        ("[mixtures.m]\ndatasets = [\"a\"]\nweights = [1]\nepoch = \"first_sweep_end\"\nmax_samples = 5\n", "mixtures.m.max_samples", "not both"),
        ("[mixtures.m]\ndatasets = [\"a\"]\nweights = [1]\nepoch = \"forever\"\n", "mixtures.m.epoch", "'forever'"),
        ("[mixtures.a]\ndatasets = [\"b\"]\nweights = [1]\n", "mixtures.a", "names a dataset too"),
        ("[mixtures.m]\ndatasets = [\"a\"]\nweights = [1]\nseed = 3\n", "mixtures.m.seed", "unknown key"),
        (
            "[mixtures.m]\ndatasets = [\"a\", \"b\"]\nweights = [1, 1]\n[[mixtures.m.schedule]]\nfrom_step = 5\nweights = [1, 2]\n[[mixtures.m.schedule]]\nfrom_step = 5\nweights = [2, 1]\n",
            "mixtures.m.schedule[1]",
            "steps must increase",
        ),
        ("[mixtures.m]\ndatasets = [\"a\", \"b\"]\nweights = [1, 1]\n[[mixtures.m.schedule]]\nfrom_step = 0\nweights = [1, 2]\n", "mixtures.m.schedule[0].from_step", "out of range"),
        ("[mixtures.m]\ndatasets = [\"a\", \"b\"]\nweights = [1, 1]\n[[mixtures.m.schedule]]\nfrom_step = 2\nweights = [1, 2, 3]\n", "mixtures.m.schedule[0].weights", "3 weights for 2 datasets"),
    ];
    for (toml, key, message) in cases {
        let dir = tempfile::tempdir().expect("temp dir");
        let c = config(dir.path(), toml);
        let out = Command::new(BIN).arg("validate").arg("--config").arg(&c).output().expect("run minibatchd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{toml} was accepted");
        assert!(stderr.contains(key) && stderr.contains(message), "{toml}: expected {key}: {message}, got {stderr}");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let c = config(dir.path(), MIXTURES);
    let out = Command::new(BIN).arg("validate").arg("--config").arg(&c).output().expect("run minibatchd");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 mixture(s): ab, abc"));
}

#[test]
fn data_of_datasets_with_other_streams_and_damaged_states_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A mixture whose datasets' streams differ is a configuration problem (found by a probe:
    // `validate` passed it, and every open of it failed): validate, dump and run refuse it.
    let other = config(dir.path(), "[mixtures.ac]\ndatasets = [\"a\", \"c\"]\nweights = [1, 1]\n");
    for args in [&["validate", "--config"][..], &["dump", "--mixture", "ac", "--minibatch-size", "4", "--config"]] {
        let out = Command::new(BIN).args(args).arg(&other).output().expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let wanted = "mixtures.ac: dataset 'c' has no stream 'features'";
        assert!(
            !out.status.success() && stderr.contains(wanted) && stderr.contains("[mixtures.NAME.streams]"),
            "{args:?}: {stderr}"
        );
    }
    let c = config(dir.path(), MIXTURES);

    let good = lines(&c, &["--mixture", "ab", "--minibatch-size", "4", "--ledger"])[1]["state"].clone();
    let mut bad_credit = good.clone();
    bad_credit["sources"][0]["credit"] = serde_json::json!(good["sources"][0]["credit"].as_i64().expect("credit") + 1);
    let mut one_source = good.clone();
    one_source["sources"].as_array_mut().expect("sources").pop();
    let mut huge = good.clone();
    huge["sources"][1]["position"] = serde_json::json!(u64::MAX);
    for (state, status, message) in [
        (bad_credit.to_string(), 1, "credits sum to"),
        (one_source.to_string(), 1, "1 sources, this mixture has 2"),
        (huge.to_string(), 1, "out of range"),
        ("{\"step\": 1}".to_owned(), 2, "no `sources` array"),
        ("not json".to_owned(), 2, "not JSON"),
    ] {
        let out = run(&c, &["--mixture", "ab", "--minibatch-size", "4", "--ledger", "--restore-state", &state]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{state}: {stderr}");
        assert!(stderr.contains(message), "{state}: {stderr}");
        assert!(out.stdout.is_empty(), "nothing is printed from a state that is refused");
    }
    // Found by a probe: with --dataset the state was ignored and the dump started afresh.
    let out =
        run(&c, &["--dataset", "a", "--minibatch-size", "4", "--full-sweep", "--restore-state", &good.to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--restore-state is a mixture's state") && out.stdout.is_empty(), "{stderr}");
}

#[test]
fn streams_of_other_names_are_mapped_onto_the_mixtures_and_other_shapes_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mapped = "[mixtures.ad]\ndatasets = [\"a\", \"d\"]\nweights = [1, 1]\nmax_samples = 12\n\
        [mixtures.ad.streams]\nvalues = [\"features\", \"x\"]\nclasses = [\"labels\", \"y\"]\n\
";
    let c = config(dir.path(), mapped);
    let data = lines(&c, &["--mixture", "ad", "--minibatch-size", "4"]);
    let ledger = lines(&c, &["--mixture", "ad", "--minibatch-size", "4", "--ledger"]);
    assert_eq!(data.len(), 3);
    for (d, l) in data.iter().zip(&ledger) {
        let streams: Vec<&String> = d["streams"].as_object().expect("streams").keys().collect();
        assert_eq!(streams, ["classes", "values"], "the mixture's streams, in name order");
        for ((source, _, index), f) in
            refs(l).iter().zip(d["streams"]["values"]["sequences"].as_array().expect("sequences"))
        {
            // Dataset d reads b.ctf, whose line i holds [i, 1].
            let second = if *source == 0 { "0" } else { "1" };
            assert_eq!(f[0][0].as_f64().map(|x| x.to_string()), Some(index.to_string()));
            assert_eq!(f[0][1].as_f64().map(|x| x.to_string()), Some(second.to_owned()));
        }
        for ((_, _, index), c) in
            refs(l).iter().zip(d["streams"]["classes"]["sequences"].as_array().expect("sequences"))
        {
            assert_eq!(c[0]["indices"], serde_json::json!([index % 3]));
        }
    }
    // Other shapes mapped onto one stream: a configuration problem, said as a configuration says
    // a shape.
    let bad = config(
        dir.path(),
        "[mixtures.bad]\ndatasets = [\"a\", \"d\"]\nweights = [1, 1]\n[mixtures.bad.streams]\nvalues = [\"features\", \"y\"]\n",
    );
    let out = Command::new(BIN).arg("validate").arg("--config").arg(&bad).output().expect("run minibatchd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("mixtures.bad: stream 'values' of the mixture")
            && stderr.contains("gives dense, dim 2, float32, dataset 'd' gives sparse, dim 3, float32"),
        "{stderr}"
    );

    for (toml, message) in [
        ("[mixtures.m]\ndatasets = [\"a\", \"d\"]\nweights = [1, 1]\n[mixtures.m.streams]\nv = [\"features\"]\n", "1 stream names for 2 datasets"),
        (
            "[mixtures.m]\ndatasets = [\"a\", \"d\"]\nweights = [1, 1]\n[mixtures.m.streams]\nv = [\"features\", \"x\"]\nw = [\"features\", \"y\"]\n",
            "stream 'features' of dataset 0 fills two streams",
        ),
        ("[mixtures.m]\ndatasets = [\"a\", \"d\"]\nweights = [1, 1]\n[mixtures.m.streams]\n", "no stream: map at least one"),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let c = config(dir.path(), toml);
        let out = Command::new(BIN).arg("validate").arg("--config").arg(&c).output().expect("run minibatchd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("mixtures.m.streams") && stderr.contains(message), "{toml}: {stderr}");
    }
}

/// Found by a probe: a mixture's session takes `sweep` with `max_samples` (epoch K of epochs of
/// that many samples), but `dump --mixture` refused the pair, so no ledger could check such a
/// session; and `dump --mixture --max-samples 0` printed nothing and succeeded, where the session
/// and `[mixtures]` refuse it. For a dataset the pair stays refused, as its session refuses it.
#[test]
fn a_mixtures_dump_takes_sweep_with_max_samples_as_its_session_does() {
    let dir = tempfile::tempdir().expect("temp dir");
    let c = config(
        dir.path(),
        &format!(
            "{MIXTURES}[mixtures.ab11]\ndatasets = [\"a\", \"b\"]\nweights = [2.5, 1]\nmax_samples = 11\n\
             [[mixtures.ab11.schedule]]\nfrom_step = 4\nweights = [1, 3]\n"
        ),
    );
    let given =
        lines(&c, &["--mixture", "ab", "--minibatch-size", "5", "--max-samples", "11", "--sweep", "2", "--ledger"]);
    let configured = lines(&c, &["--mixture", "ab11", "--minibatch-size", "5", "--sweep", "2", "--ledger"]);
    assert!(!given.is_empty());
    assert_eq!(given.len(), configured.len());
    for (g, k) in given.iter().zip(&configured) {
        assert_eq!((&g["fingerprint"], refs(g)), (&k["fingerprint"], refs(k)));
    }
    let refused = |args: &[&str]| {
        let out = run(&c, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = refused(&["--mixture", "ab", "--minibatch-size", "4", "--max-samples", "0", "--ledger"]);
    assert!(e.contains("--max-samples must be at least 1"), "{e}");
    let e = refused(&["--dataset", "a", "--minibatch-size", "4", "--max-samples", "5", "--sweep", "1"]);
    assert!(e.contains("at most one of"), "{e}");
    // Found by a probe: a dataset's epoch of 0 samples printed nothing and succeeded (CNTK 2.7
    // refuses it: "Epoch size cannot be 0"), as a mixture's did before.
    let e = refused(&["--dataset", "a", "--minibatch-size", "4", "--max-samples", "0"]);
    assert!(e.contains("--max-samples must be at least 1"), "{e}");
    // Found by a probe: any u64 was taken, and a minibatch that an endless epoch never fills
    // gathered sweep after sweep into memory. A session's range, as the daemon's.
    for args in [&["--minibatch-size", "2147483648"][..], &["--minibatch-sizes", "4,18446744073709551615"][..]] {
        let e = refused(&[&["--dataset", "a"][..], args].concat());
        assert!(e.contains("out of range 1..=2147483647"), "{e}");
    }
    // Found by a probe: any number of workers was taken, where a session's `num_workers` is
    // refused past 2^20 (and at 0).
    for workers in ["0", "1048577", "18446744073709551615"] {
        for target in [&["--dataset", "a"][..], &["--mixture", "ab"][..]] {
            let e = refused(&[target, &["--minibatch-size", "4", "--workers", workers][..]].concat());
            assert!(e.contains("out of range 1..=1048576"), "{e}");
        }
    }
}
