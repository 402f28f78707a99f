//! The `deepnvme` binary as a user runs it: help, exit statuses, size
//! suffixes, and the `--json` output of `info`, `bench` and `tune` (tiny
//! runs in a temp dir under the target dir, a real file system for O_DIRECT).

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

#[test]
fn help_lists_commands_and_options() {
    let dir = TempDir::new("help");
    let o = run_in(&dir.0, &["--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for word in ["bench", "tune", "info", "doctor", "DEEPNVME_ENGINE"] {
        assert!(stdout(&o).contains(word), "top-level help lacks {word}: {}", stdout(&o));
    }
    for (cmd, options) in [
        ("bench", &["--block-size", "--queue-depth", "--single-submit", "--no-prepare", "--json", "SIZE takes a suffix"][..]),
        ("tune", &["--block-size", "--overlap-events", "--top", "comma-separated"][..]),
        ("info", &["--dir", "--json"][..]),
        ("doctor", &["--dir", "--config", "--model-params", "--python", "--only", "--no-bench", "--json", "exit status is 1"][..]),
    ] {
        for help in [vec![cmd, "--help"], vec![cmd, "-h"], vec!["help", cmd]] {
            let o = run_in(&dir.0, &help);
            assert!(o.status.success(), "{help:?}: {}", stderr(&o));
            let text = stdout(&o);
            assert!(text.contains(&format!("Usage: deepnvme {cmd}")), "{help:?}: {text}");
            for opt in options.iter().filter(|o| help[1] != "-h" || o.starts_with("--")) {
                assert!(text.contains(opt), "{help:?} lacks {opt}: {text}");
            }
        }
    }
    let v = run_in(&dir.0, &["--version"]);
    assert_eq!(stdout(&v).trim(), format!("deepnvme {}", env!("CARGO_PKG_VERSION")));
    assert!(dir.entries().is_empty(), "help left files: {:?}", dir.entries());
}

#[test]
fn bad_command_lines_exit_2_and_create_nothing() {
    let dir = TempDir::new("usage");
    for (args, says) in [
        (&[][..], "Usage: deepnvme <COMMAND>"),
        (&["frob"][..], "frob"),
        (&["bench", "--size", "12Q"][..], "unknown size suffix"),
        (&["bench", "--size", "0"][..], "must be positive"),
        (&["bench", "--bogus"][..], "--bogus"),
        (&["bench", "--read-only", "--write-only"][..], "cannot be used with"),
        (&["bench", "--engine", "libaio"][..], "expected uring or psync"),
        (&["bench", "--queue-depth", "40000", "--size", "4M"][..], "queue_depth 40000"),
        (&["tune", "--single-submit=maybe"][..], "expected true, false or both"),
        (&["tune", "--block-size", "1M,x"][..], "--block-size"),
    ] {
        let o = run_in(&dir.0, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?} should say {says:?}: {}", stderr(&o));
    }
    assert!(dir.entries().is_empty(), "usage errors left files: {:?}", dir.entries());
}

/// Sizes reach the tool with their suffixes applied: `--size 4M` with
/// `--buffer-size 1M` makes 1 MiB ops, which 3 workers cannot share.
#[test]
fn size_suffixes_are_powers_of_1024() {
    let dir = TempDir::new("sizes");
    let o = run_in(&dir.0, &["bench", "--size", "4M", "--buffer-size", "1M", "--parallelism", "3"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is 1048576 bytes"), "{}", stderr(&o));
    let o = run_in(&dir.0, &["bench", "--size", "1.5k", "--parallelism", "1024"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is 1536 bytes"), "{}", stderr(&o));
    assert!(dir.entries().is_empty(), "the temp file was left: {:?}", dir.entries());
}

#[test]
fn info_json_has_the_expected_keys() {
    let dir = TempDir::new("info");
    let j = json_of(&dir.0, &["info", "--json", "--dir", dir.0.to_str().unwrap()]);
    assert_eq!(j["command"], "info");
    assert_eq!(j["version"], env!("CARGO_PKG_VERSION"));
    let engine = j["engine"].as_str().expect("engine is a string");
    assert!(engine == "io_uring" || engine == "psync", "engine {engine}");
    assert!(j["io_uring_available"].is_boolean());
    assert_eq!(j["io_uring_available"].as_bool(), Some(j["io_uring_error"].is_null()));
    assert!(j["deepnvme_engine_env"].is_null(), "DEEPNVME_ENGINE was removed from the environment");
    assert_eq!(Path::new(j["dir"].as_str().unwrap()), std::fs::canonicalize(&dir.0).unwrap());
    // The target dir is on a real file system: O_DIRECT works there.
    assert_eq!(j["o_direct"], true, "{j}");
    let offset = j["dio_offset_align"].as_u64().expect("dio_offset_align");
    assert!(offset.is_power_of_two() && offset >= 1, "dio_offset_align {offset}");
    assert!(j["dio_memory_align"].as_u64().is_some_and(|m| m.is_power_of_two()));
    assert!(j["dio_align_reported_by_statx"].is_boolean());
    assert!(j.get("o_direct_error").is_none());
    for key in ["memlock_soft_bytes", "memlock_hard_bytes"] {
        assert!(j[key].is_null() || j[key].is_u64(), "{key}: {}", j[key]);
    }
    assert!(j["cap_ipc_lock"].is_boolean());
    assert!(j["page_size"].as_u64().is_some_and(|p| p >= 4096 && p.is_power_of_two()));
    assert!(j["cpus"].as_u64().is_some_and(|n| n >= 1));
    assert!(dir.entries().is_empty(), "the O_DIRECT probe file was left: {:?}", dir.entries());
    // The engine per file: the disk keeps the handle's engine; tmpfs gets
    // psync when that engine is io_uring (DEEPNVME_ENGINE is unset here).
    assert!(j["file_engine_rule"].as_str().is_some_and(|r| r.contains("tmpfs")), "{j}");
    assert_eq!(j["dir_engine"], j["engine"], "{j}");
    assert!(j["dir_engine_file_system"].is_null(), "{j}");
    let shm = Path::new("/dev/shm");
    let on_tmpfs = std::process::Command::new("stat").args(["-f", "-c", "%T", "/dev/shm"]).output();
    if on_tmpfs.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "tmpfs") {
        let j = json_of(&dir.0, &["info", "--json", "--dir", shm.to_str().unwrap()]);
        let want = if engine == "io_uring" { ("psync", "tmpfs") } else { (engine, "") };
        assert_eq!(j["dir_engine"], want.0, "{j}");
        if engine == "io_uring" {
            assert_eq!(j["dir_engine_file_system"], want.1, "{j}");
        }
    }

    let o = run_in(&dir.0, &["info", "--dir", "no-such-dir"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
}

/// zram says its O_DIRECT memory alignment is 512 B, but the core raises it
/// to the page there (`src/file/device_quirks.rs`): `info` reports what the
/// core uses and says where it came from, statx's number beside it.
#[test]
fn info_on_zram_reports_the_raised_memory_alignment_and_why() {
    let Some(mut zram) = deepnvme::test_support::zram::Zram::for_test("cli-info-zram") else { return };
    let Some(mnt) = zram.mount_ext4() else { return };
    let dir = TempDir::new("info-zram");
    let j = json_of(&dir.0, &["info", "--json", "--dir", mnt.to_str().unwrap()]);
    assert_eq!(j["o_direct"], true, "{j}");
    let page = j["page_size"].as_u64().unwrap();
    assert_eq!(j["dio_memory_align"].as_u64(), Some(page), "{j}");
    let statx = j["dio_memory_align_statx"].as_u64().expect("statx's smaller number beside the raised one");
    assert!(statx < page, "{j}");
    let o = run_in(&dir.0, &["info", "--dir", mnt.to_str().unwrap()]);
    let text = stdout(&o);
    assert!(
        text.contains(&format!("memory of {page} B")) && text.contains(&format!("says memory of {statx} B")) && text.contains("zram"),
        "{text}"
    );
    // On the target dir's own file system the core keeps statx's number.
    let j = json_of(&dir.0, &["info", "--json", "--dir", dir.0.to_str().unwrap()]);
    assert!(j.get("dio_memory_align_statx").is_none(), "{j}");
}

#[test]
fn bench_json_reports_both_directions() {
    for engine in ["uring", "psync"] {
        let dir = TempDir::new("bench");
        let j = json_of(
            &dir.0,
            &["bench", "--size", "4M", "--block-size", "256k", "--loops", "2", "--engine", engine, "--json", "-q"],
        );
        assert_eq!(j["command"], "bench");
        if engine == "psync" || j["engine"] != "psync" {
            // uring falls back to psync only where io_uring is blocked.
            assert_eq!(j["engine"], if engine == "psync" { "psync" } else { "io_uring" });
        }
        assert_eq!(j["size_bytes"], 4 << 20);
        assert_eq!(j["buffer_bytes"], 4 << 20, "the buffer shrinks to --size");
        assert_eq!(j["loops"], 2);
        assert_eq!(j["gb_bytes"], 1_000_000_000u64);
        assert_eq!(j["file_removed"], true);
        assert!(j["buffer_locked"].is_boolean());
        let k = &j["knobs"];
        assert_eq!(k["block_size"], 256 << 10);
        assert_eq!(k["queue_depth"], 128);
        assert_eq!(k["single_submit"], false);
        assert_eq!(k["overlap_events"], false);
        assert_eq!(k["intra_op_parallelism"], 1);
        for d in ["write", "read"] {
            let s = &j[d];
            let best = positive(&s["gb_per_s_best"], "gb_per_s_best");
            let mean = positive(&s["gb_per_s_mean"], "gb_per_s_mean");
            assert!(mean <= best * 1.0001, "{d}: mean {mean} > best {best}");
            assert!(s["cpu_s_per_gb"].as_f64().is_some_and(|c| c >= 0.0), "{d}: {s}");
            let secs = s["seconds"].as_array().expect("seconds");
            assert_eq!(secs.len(), 2, "one time per loop");
            // Best GB/s is 4 MiB over the fastest pass, to the 4 decimals shown.
            let fastest = secs.iter().map(|t| positive(t, "seconds")).fold(f64::INFINITY, f64::min);
            let expect = (4u64 << 20) as f64 / 1e9 / fastest;
            assert!((best - expect).abs() <= 1e-3 * expect + 1e-4, "{d}: best {best}, from seconds {expect}");
            assert_eq!(s["cpu_seconds"].as_array().map(Vec::len), Some(2));
        }
        assert!(dir.entries().is_empty(), "the temp file was left: {:?}", dir.entries());
    }
}

#[test]
fn bench_one_direction_and_existing_file() {
    let dir = TempDir::new("bench-file");
    let file = dir.0.join("data.bin");
    let f = file.to_str().unwrap();
    let j = json_of(&dir.0, &["bench", "--file", f, "--size", "2M", "--write-only", "--json", "-q"]);
    assert!(j.get("read").is_none() && j.get("write").is_some(), "{j}");
    assert_eq!(j["file_removed"], true, "a file the tool created is removed");
    assert!(!file.exists());

    std::fs::write(&file, vec![7u8; 3 << 20]).unwrap();
    // --read-only on an existing file reads all of it by default, and keeps it.
    let j = json_of(&dir.0, &["bench", "--file", f, "--read-only", "--json", "-q"]);
    assert!(j.get("write").is_none() && j.get("read").is_some(), "{j}");
    assert_eq!(j["size_bytes"], 3 << 20);
    assert_eq!(j["file_removed"], false);
    assert_eq!(std::fs::read(&file).unwrap(), vec![7u8; 3 << 20], "a read-only run changed the file");
}

#[test]
fn tune_ranks_points_and_prints_an_aio_block() {
    let dir = TempDir::new("tune");
    let grid = [
        "tune", "--size", "2M", "--block-size", "256k,1M,1M", "--queue-depth", "8", "--parallelism", "1",
        "--no-single-submit", "--overlap-events=false", "-q",
    ];
    let mut args = grid.to_vec();
    args.push("--json");
    let j = json_of(&dir.0, &args);
    assert_eq!(j["command"], "tune");
    assert_eq!(j["criterion"], "read + write GB/s");
    let points = j["points"].as_array().expect("points");
    assert_eq!(points.len(), 2, "repeated list items are measured once");
    let scores: Vec<f64> = points.iter().map(|p| positive(&p["score"], "score")).collect();
    assert!(scores[0] >= scores[1], "points are ranked best first: {scores:?}");
    for p in points {
        let sum = positive(&p["read"]["gb_per_s_best"], "read") + positive(&p["write"]["gb_per_s_best"], "write");
        assert!((sum - p["score"].as_f64().unwrap()).abs() < 1e-3, "score is read + write: {p}");
    }
    assert_eq!(j["best_overall"], points[0]);
    let aio = j["aio"].as_object().expect("aio block");
    let keys: Vec<&str> = aio.keys().map(String::as_str).collect();
    let mut expected =
        vec!["block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events", "use_gds"];
    expected.sort_unstable();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, expected);
    assert_eq!(aio["block_size"], points[0]["knobs"]["block_size"]);
    assert_eq!(aio["queue_depth"], 8);
    assert_eq!(aio["single_submit"], false);
    assert_eq!(aio["use_gds"], false);

    // Text mode: the ranked table and the config block, which is JSON.
    let o = run_in(&dir.0, &grid);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("Top 2 of 2 by read + write GB/s"), "{text}");
    let block = text.split("DeepSpeed config:\n").nth(1).expect("a DeepSpeed config block");
    let cfg: Value = serde_json::from_str(block).expect("the config block is JSON");
    assert_eq!(cfg["aio"]["queue_depth"], 8);
    assert!(dir.entries().is_empty(), "the temp file was left: {:?}", dir.entries());
}

/// `stripe inspect` of a set one of whose members has a problem (its
/// marker gone: a drive not mounted) says PROBLEM and exits 1, in text and
/// JSON, so that a script can tell; with the marker back it exits 0.
#[test]
fn stripe_inspect_exits_1_when_a_member_has_a_problem() {
    let dir = TempDir::new("stripe-inspect");
    for d in ["set", "m0", "m1"] {
        std::fs::create_dir_all(dir.0.join(d)).unwrap();
    }
    let o = run_in(&dir.0, &["stripe", "create", "set", "m0", "m1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("over 2 members"), "{}", stdout(&o));
    let marker = dir.0.join("m1/.deepnvme-stripe-member");
    let kept = std::fs::read(&marker).unwrap();
    std::fs::remove_file(&marker).unwrap();
    let o = run_in(&dir.0, &["stripe", "inspect", "set"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("PROBLEM") && stderr(&o).contains("have a problem"), "{}{}", stdout(&o), stderr(&o));
    let o = run_in(&dir.0, &["stripe", "inspect", "--json", "set"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let j: Value = serde_json::from_str(&stdout(&o)).expect("JSON on stdout");
    assert!(j["members"][1]["problem"].is_string(), "{j}");
    std::fs::write(&marker, kept).unwrap();
    let j = json_of(&dir.0, &["stripe", "inspect", "--json", "set"]);
    assert!(j["members"][1]["problem"].is_null(), "{j}");
}

/// `stripe cp` copies a striped file by its bytes: out of the set a plain
/// file holding them, into the set a striped file of its own (with member
/// files at its own path), into a folder by the source's name; `stripe
/// cat` of each gives the same bytes, and a missing source exits non-zero
/// naming it.
#[test]
fn stripe_cp_copies_a_striped_file_by_its_bytes() {
    let dir = TempDir::new("stripe-cp");
    for d in ["set", "m0", "m1", "out"] {
        std::fs::create_dir_all(dir.0.join(d)).unwrap();
    }
    let o = run_in(&dir.0, &["stripe", "create", "--unit", "64K", "set", "m0", "m1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let data: Vec<u8> = (0..(300u32 << 10) + 5).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let h = deepnvme::IoHandle::new(deepnvme::HandleConfig::default()).unwrap();
    h.write_from(&data, deepnvme::FileTarget::Path(&dir.0.join("set/a.swp")), 0).unwrap();
    assert!(std::fs::read(dir.0.join("set/a.swp")).unwrap().iter().all(|&b| b == 0), "a.swp is not striped");
    for (dest, file) in [("out/b.swp", "out/b.swp"), ("out", "out/a.swp"), ("set/c.swp", "set/c.swp")] {
        let o = run_in(&dir.0, &["stripe", "cp", "set/a.swp", dest]);
        assert!(o.status.success(), "cp to {dest}: {}", stderr(&o));
        let o = run_in(&dir.0, &["stripe", "cat", file]);
        assert!(o.status.success() && o.stdout == data, "{file}: {} bytes, {}", o.stdout.len(), stderr(&o));
    }
    assert_eq!(std::fs::read(dir.0.join("out/b.swp")).unwrap(), data, "the copy out of the set holds the bytes");
    for m in ["m0", "m1"] {
        assert!(dir.0.join(m).join("c.swp").exists(), "the copy in the set has no member file in {m}");
    }
    let o = run_in(&dir.0, &["stripe", "cp", "set/none", "out"]);
    assert!(!o.status.success() && stderr(&o).contains("set/none"), "{}", stderr(&o));
}
