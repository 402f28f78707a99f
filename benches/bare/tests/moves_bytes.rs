//! The bare baseline moves the bytes it claims to: each engine, at
//! parallelism 1 and 2, writes its buffer's byte over a whole file with
//! O_DIRECT, and reads it back into a buffer filled with another byte.

use std::path::PathBuf;
use std::process::Command;

fn bare(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bare")).args(args).output().expect("running bare")
}

fn file(name: &str) -> PathBuf {
    // Under target/, on the checkout's file system: O_DIRECT is the point.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bare-moves-bytes");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn every_engine_writes_and_reads_the_whole_file() {
    for engine in ["uring", "psync"] {
        for par in ["1", "2"] {
            let f = file(&format!("{engine}-{par}.dat"));
            std::fs::write(&f, vec![0u8; 16 << 20]).unwrap();
            let p = f.to_str().unwrap();
            let common = ["--file", p, "--size", "16M", "--op-bytes", "8M", "--block-size", "1M", "--queue-depth", "4",
                          "--parallelism", par, "--engines", engine];
            let w = bare(&[&common[..], &["--op", "write", "--fill", "0x11"]].concat());
            assert!(w.status.success(), "{engine} p{par} write: {}", String::from_utf8_lossy(&w.stderr));
            let out: serde_json::Value = serde_json::from_slice(&w.stdout).unwrap();
            assert_eq!(out["best"], engine);
            assert!(out["gb_per_s"].as_f64().unwrap() > 0.0);
            let bytes = std::fs::read(&f).unwrap();
            assert_eq!(bytes.len(), 16 << 20);
            assert!(bytes.iter().all(|&b| b == 0x11), "{engine} p{par}: the write left other bytes in the file");

            let r = bare(&[&common[..], &["--op", "read", "--fill", "0x5a", "--expect", "0x11"]].concat());
            assert!(r.status.success(), "{engine} p{par} read: {}", String::from_utf8_lossy(&r.stderr));
            // The check itself can fail: the file does not hold 0x22.
            let bad = bare(&[&common[..], &["--op", "read", "--expect", "0x22"]].concat());
            assert!(!bad.status.success());
            assert!(String::from_utf8_lossy(&bad.stderr).contains("not the expected 0x22"));
            std::fs::remove_file(&f).unwrap();
        }
    }
}

#[test]
fn a_missing_file_is_named_in_the_error() {
    let f = file("no-such-dir/x.dat");
    let r = bare(&["--file", f.to_str().unwrap(), "--op", "read", "--size", "8M"]);
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("x.dat") && err.contains("No such file"), "{err}");
}
