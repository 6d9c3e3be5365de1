//! Issue #16: one daemon per node, the data in object storage, nodes that never talk to each
//! other. A simulated cluster on one machine: four daemons (their own sockets and state
//! directories) over one bucket of moto's S3 server, two ranks each (global rank = node × 2 +
//! local rank, world size 8), started together.
//!
//! * Each object is indexed by one node; the others download its index.
//! * Over all ranks of all nodes, the sweep is delivered exactly once, with equal step counts
//!   (`equal_steps`, `tail = "pad"`: the ranks with fewer minibatches get empty ones).
//! * A job stopped at ragged positions resumes at another world size, 4×2 → 3×2 and 2×2 → 5×1
//!   (`resume_job` with every rank's state): over both runs the sweep is delivered exactly once.

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use minibatchd_client::protocol::{SessionOptions, SessionState, TailPolicy};
use minibatchd_client::{Client, Session};
use support::daemon::{http_get, json, Daemon};
use support::s3::S3Server;
use support::write;

const BUCKET: &str = "cluster";
/// Sequences (one sample each: `|id N`) in the dataset, over three objects.
const LINES: usize = 3000;

fn upload(server: &S3Server) {
    server.create_bucket(BUCKET);
    for part in 0..3 {
        let mut text = String::new();
        for i in (part * LINES / 3)..((part + 1) * LINES / 3) {
            let _ = writeln!(text, "|id {i}");
        }
        server.put(BUCKET, &format!("data/part-{part}.ctf"), text.as_bytes());
    }
}

/// A node: its directory (config, socket, state) and daemon.
fn node(root: &Path, n: usize, server: &S3Server) -> (PathBuf, Daemon) {
    let dir = root.join(format!("node-{n}"));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let d = dir.display();
    write(
        &dir,
        "minibatchd.toml",
        format!(
            "[daemon]\nsocket = \"{d}/mbd.sock\"\nmetrics_listen = \"127.0.0.1:0\"\nstate_dir = \"{d}/state\"\n\
             ring_slots = 4\nslot_size_bytes = 65536\n\n\
             [datasets.train]\nformat = \"ctf\"\nfiles = [\"s3://{BUCKET}/data/\"]\nchunk_size_bytes = 1024\n\
             [datasets.train.streams.id]\ndim = 1\nformat = \"dense\"\n\
             [datasets.train.sampling]\nrandomize = true\nwindow_chunks = 6\nseed = 11\n"
        ),
    );
    let daemon = Daemon::start(&dir, &server.env());
    (dir, daemon)
}

fn session_options(world: u64, rank: u64) -> SessionOptions {
    SessionOptions {
        minibatch_size: Some(8 * world),
        full_sweep: true,
        equal_steps: true,
        tail: Some(TailPolicy::Pad),
        num_workers: Some(world),
        rank: Some(rank),
        ..SessionOptions::default()
    }
}

/// The ids of one minibatch.
fn ids(mb: &minibatchd_engine::minibatch::Minibatch) -> Vec<u64> {
    let line: serde_json::Value = serde_json::from_str(&json(mb, &["id"])).expect("json");
    line["streams"]["id"]["sequences"]
        .as_array()
        .map(|seqs| {
            seqs.iter()
                .flat_map(|s| s.as_array().into_iter().flatten())
                .flat_map(|sample| sample.as_array().into_iter().flatten())
                .filter_map(serde_json::Value::as_f64)
                // Whole numbers below 2^53: the ids are line numbers.
                .map(|v| format!("{v:.0}").parse::<u64>().expect("a whole id"))
                .collect()
        })
        .unwrap_or_default()
}

/// Reads up to `max` minibatches (all with `None`): the ids of each.
fn read(s: &mut Session, max: Option<usize>) -> Vec<Vec<u64>> {
    let mut out = Vec::new();
    while max.is_none_or(|m| out.len() < m) {
        match s.next_owned().expect("next minibatch") {
            Some(mb) => out.push(ids(&mb)),
            None => break,
        }
    }
    out
}

/// How often each id was delivered.
fn counts<'a>(batches: impl IntoIterator<Item = &'a Vec<u64>>) -> BTreeMap<u64, usize> {
    let mut c = BTreeMap::new();
    for id in batches.into_iter().flatten() {
        *c.entry(*id).or_insert(0) += 1;
    }
    c
}

fn assert_exactly_once(c: &BTreeMap<u64, usize>, what: &str) {
    let twice: Vec<_> = c.iter().filter(|(_, &n)| n != 1).map(|(id, n)| (*id, *n)).take(10).collect();
    assert!(twice.is_empty(), "{what}: delivered more than once: {twice:?}");
    assert_eq!(c.len(), LINES, "{what}: {} of {LINES} sequences delivered", c.len());
}

/// `(node, local rank)` → session, world of `nodes.len() × per_node` ranks.
fn open_all(daemons: &[&Daemon], per_node: u64, resume_job: Option<&[SessionState]>) -> Vec<Session> {
    let world = daemons.len() as u64 * per_node;
    let mut sessions = Vec::new();
    for (n, d) in daemons.iter().enumerate() {
        for local in 0..per_node {
            let mut o = session_options(world, n as u64 * per_node + local);
            o.resume_job = resume_job.map(<[SessionState]>::to_vec);
            sessions.push(
                Client::open_when_indexed(&d.socket, "train", &o, Some(support::daemon::DEADLINE)).expect("open"),
            );
        }
    }
    sessions
}

#[test]
fn four_nodes_deliver_the_sweep_once_with_equal_steps_and_index_each_object_once() {
    let server = S3Server::start();
    upload(&server);
    let root = tempfile::tempdir().expect("tempdir");
    // Started together: they race for the indexes.
    let (path, server_ref) = (root.path(), &server);
    let nodes: Vec<(PathBuf, Daemon)> = std::thread::scope(|s| {
        let starting: Vec<_> = (0..4).map(|n| s.spawn(move || node(path, n, server_ref))).collect();
        starting.into_iter().map(|h| h.join().expect("node")).collect()
    });
    let daemons: Vec<&Daemon> = nodes.iter().map(|(_, d)| d).collect();
    let mut sessions = open_all(&daemons, 2, None);
    let per_rank: Vec<Vec<Vec<u64>>> = sessions.iter_mut().map(|s| read(s, None)).collect();
    let steps: Vec<usize> = per_rank.iter().map(Vec::len).collect();
    assert!(steps.iter().all(|&n| n == steps[0]), "unequal step counts: {steps:?}");
    assert_exactly_once(&counts(per_rank.iter().flatten()), "4 nodes × 2 ranks");
    let padding: usize = per_rank.iter().flatten().filter(|b| b.is_empty()).count();
    println!("{} steps per rank, {padding} padding minibatches in all", steps[0]);
    // Each of the 3 objects was indexed by one node and downloaded by the other three.
    let mut indexed = 0.0;
    let mut downloaded = 0.0;
    for (dir, _) in &nodes {
        let (_, body) = http_get(&dir.join("state"), "/metrics").expect("metrics");
        for line in body.lines() {
            let value = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            if line.starts_with("minibatchd_object_indexes{outcome=\"indexed") {
                indexed += value(line);
            } else if line.starts_with("minibatchd_object_indexes{outcome=\"downloaded\"}") {
                downloaded += value(line);
            }
        }
    }
    assert_eq!((indexed, downloaded), (3.0, 9.0), "indexes built / downloaded over the 4 nodes");
}

/// Runs a job of `from` nodes × `from_per_node` ranks for a ragged number of minibatches (rank r
/// takes `3 + r % 3`), then resumes it with `to` nodes × `to_per_node` ranks from every rank's
/// state; over both runs the sweep is delivered exactly once.
fn resume_across_world_sizes(from: usize, from_per_node: u64, to: usize, to_per_node: u64) {
    let server = S3Server::start();
    upload(&server);
    let root = tempfile::tempdir().expect("tempdir");
    let nodes: Vec<(PathBuf, Daemon)> = (0..from.max(to)).map(|n| node(root.path(), n, &server)).collect();
    let first: Vec<&Daemon> = nodes.iter().take(from).map(|(_, d)| d).collect();
    let mut sessions = open_all(&first, from_per_node, None);
    let mut delivered: Vec<Vec<u64>> = Vec::new();
    let mut states = Vec::new();
    for (rank, s) in sessions.iter_mut().enumerate() {
        delivered.extend(read(s, Some(3 + rank % 3)));
        states.push(s.state().expect("state"));
    }
    drop(sessions);
    let second: Vec<&Daemon> = nodes.iter().take(to).map(|(_, d)| d).collect();
    let mut resumed = open_all(&second, to_per_node, Some(&states));
    let per_rank: Vec<Vec<Vec<u64>>> = resumed.iter_mut().map(|s| read(s, None)).collect();
    let steps: Vec<usize> = per_rank.iter().map(Vec::len).collect();
    assert!(steps.iter().all(|&n| n == steps[0]), "unequal step counts after the resume: {steps:?}");
    delivered.extend(per_rank.into_iter().flatten());
    let world = |n: usize, p: u64| n as u64 * p;
    assert_exactly_once(
        &counts(&delivered),
        &format!("{} ranks, resumed at {}", world(from, from_per_node), world(to, to_per_node)),
    );
}

#[test]
fn a_job_of_four_nodes_by_two_resumes_on_three_nodes_by_two_exactly() {
    resume_across_world_sizes(4, 2, 3, 2);
}

#[test]
fn a_job_of_two_nodes_by_two_resumes_on_five_nodes_by_one_exactly() {
    resume_across_world_sizes(2, 2, 5, 1);
}
