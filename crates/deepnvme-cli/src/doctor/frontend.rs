//! The `frontend` section: which front end DeepSpeed will load and why,
//! asked of the Python that runs DeepSpeed (`--python`, else
//! `$VIRTUAL_ENV/bin/python`, else `python3`), which runs
//! `frontend_probe.py`: torch, DeepSpeed, numpy and pybind11 versions, the
//! deepnvme package and its build record, the `.pth` hook,
//! `deepnvme.choose_frontend()`'s answer and what `AsyncIOBuilder().load()`
//! returns. Compiled modules built for another torch are named, with the
//! command that rebuilds them. The same interpreter then runs
//! `config_probe.py` (the config through DeepSpeed's own validation, for the
//! `config` section), so torch and DeepSpeed are imported once per run.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::config::read;
use super::report::Finding;
use super::Context;

const SECTION: &str = "frontend";
const PROBE: &str = include_str!("frontend_probe.py");
const CONFIG_PROBE: &str = include_str!("config_probe.py");
/// The config `config_probe.py` validates.
const CONFIG_ENV: &str = "DEEPNVME_DOCTOR_CONFIG";
/// The config `config_probe.py` alone reads (`read_config`).
const READ_ENV: &str = "DEEPNVME_DOCTOR_READ";
const MARKER: &str = "DEEPNVME-DOCTOR-JSON:";
/// Importing torch and DeepSpeed takes seconds; a wedged CUDA driver, forever.
const TIMEOUT: Duration = Duration::from_secs(240);

/// What the probe reported.
#[derive(Clone, Debug)]
pub struct PythonInfo {
    pub python: PathBuf,
    pub raw: Value,
    /// GPUDirect Storage as the probe's process (torch loaded) sees it.
    pub gds: Option<Result<(), String>>,
    /// libcufile files pip's CUDA packages installed in that Python.
    pub cufile_candidates: Vec<String>,
}

impl PythonInfo {
    fn str(&self, key: &str) -> Option<&str> {
        self.raw.get(key).and_then(Value::as_str)
    }
    fn error(&self, key: &str) -> Option<&str> {
        self.raw.get(format!("{key}_error")).and_then(Value::as_str)
    }
}

/// The console script's interpreter (`deepnvme/__main__.py` sets it when the
/// CLI runs from the wheel), so that `venv/bin/deepnvme doctor` checks that
/// venv even when it is not activated.
const SHIM_PYTHON_ENV: &str = "DEEPNVME_CLI_PYTHON";

/// The interpreter to ask: the one the console script ran in, else the
/// active virtual environment's, else `python3`.
pub fn default_python() -> PathBuf {
    if let Some(python) = std::env::var_os(SHIM_PYTHON_ENV).filter(|p| Path::new(p).exists()) {
        return PathBuf::from(python);
    }
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        let p = Path::new(&venv).join("bin/python");
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("python3")
}

/// Runs `script` in `python` with `env`, and returns the JSON object it
/// prints after [`MARKER`]. Errors say why it gave none.
fn run_script(python: &Path, script: &str, env: &[(&str, PathBuf)], timeout: Duration) -> Result<Value, String> {
    let mut cmd = Command::new(python);
    cmd.arg("-c").arg(script).env_remove(CONFIG_ENV).env_remove(READ_ENV);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    // Both pipes drain on threads, so a chatty child never blocks on a full pipe.
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("{} did not finish within {} s", python.display(), timeout.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => break Err(e.to_string()),
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let status = status?;
    let Some(line) = stdout.lines().rev().find_map(|l| l.strip_prefix(MARKER)) else {
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        let tail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
        return Err(format!(
            "{} exited with {status} without a report{}",
            python.display(),
            if tail.is_empty() { String::new() } else { format!(": {tail}") }
        ));
    };
    serde_json::from_str(line).map_err(|e| format!("the probe's report is not JSON: {e}"))
}

/// DeepSpeed's reading of the config file `path` (hjson and its
/// duplicate-key hook, `read_config` in `config_probe.py`) in `python`,
/// for a file the doctor cannot read itself. The outer error: no reading
/// (no Python, no DeepSpeed); the inner one: DeepSpeed's reader refuses it.
pub fn read_config(python: &Path, path: &Path) -> Result<Result<read::Read, String>, String> {
    let script = format!("{CONFIG_PROBE}\n");
    let env = [
        (READ_ENV, std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())),
        ("DEEPNVME_DOCTOR_MARKER", PathBuf::from(MARKER)),
    ];
    let report = run_script(python, &script, &env, TIMEOUT)?;
    if let Some(why) = report.get("unavailable").and_then(Value::as_str) {
        return Err(format!("{} cannot import DeepSpeed's reader ({why})", python.display()));
    }
    Ok(read::from_report(&report, python))
}

/// Runs the probes in `python` (with `config` for `config_probe.py`).
/// Errors say why it gave no report.
pub fn probe(python: &Path, config: Option<&Path>) -> Result<PythonInfo, String> {
    let script = format!("{PROBE}\n{CONFIG_PROBE}\nsys.stdout.flush()\nprint(MARKER + json.dumps(out), flush=True)\n");
    let env: Vec<(&str, PathBuf)> = config
        .map(|c| (CONFIG_ENV, std::fs::canonicalize(c).unwrap_or_else(|_| c.to_path_buf())))
        .into_iter()
        .collect();
    let raw = run_script(python, &script, &env, TIMEOUT)?;
    let gds = match (raw.get("gds_unavailable"), raw.get("gds_unavailable_error")) {
        (Some(Value::Null), None) => Some(Ok(())),
        (Some(Value::String(why)), None) => Some(Err(why.clone())),
        (_, Some(e)) => Some(Err(e.as_str().unwrap_or("?").to_string())),
        _ => None,
    };
    let cufile_candidates = raw
        .get("cufile_candidates")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    Ok(PythonInfo { python: python.to_path_buf(), raw, gds, cufile_candidates })
}

/// The command that rebuilds the compiled modules for the torch installed
/// in `python`: pip builds the package from the checkout this binary runs
/// from (`cargo run`: `<checkout>/target/...`), found at run time so that the
/// binary holds no build path (the wheel's CLI is the same bytes wherever
/// it was built).
fn rebuild(python: &str) -> String {
    let source = std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .map(|dir| dir.join("bindings"))
                .find(|b| b.join("setup.py").exists() && b.join("../Cargo.toml").exists())
        })
        .and_then(|b| std::fs::canonicalize(b).ok())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "<deepnvme checkout>/bindings".into());
    format!(
        "rebuild them for this torch: {python} -m pip install --no-build-isolation --no-deps --force-reinstall \
         {source} \
         (needs a C++ compiler; bindings/install.sh does the same for its own venv)"
    )
}

fn versions(p: &PythonInfo) -> String {
    let v = |k: &str| p.str(k).unwrap_or("not installed").to_string();
    let pybind = p
        .raw
        .get("torch_abi")
        .and_then(|a| a.get("pybind11"))
        .and_then(Value::as_str)
        .map(|t| format!("; pybind11 in torch's headers: {t}"))
        .unwrap_or_default();
    format!(
        "Python {} ({}): torch {}, deepspeed {}, numpy {}{pybind}",
        p.str("python").unwrap_or("?"),
        p.str("executable").unwrap_or("?"),
        v("torch"),
        v("deepspeed"),
        v("numpy")
    )
}

pub fn check(ctx: &Context) -> Vec<Finding> {
    let p = match ctx.python_probe() {
        Ok(p) => p,
        Err(why) => {
            return vec![Finding::warn(SECTION, "python", "no report from Python")
                .why(why.clone())
                .fix("pass --python /path/to/the/venv/bin/python (the one that runs DeepSpeed)")]
        }
    };
    let python = p.python.display().to_string();
    let mut out = vec![Finding::ok(SECTION, "python", versions(p))];
    if p.raw.get("deepnvme").is_none_or(Value::is_null) {
        let ds = p.str("deepspeed").is_some();
        out.push(
            Finding::warn(SECTION, "deepnvme", format!("not installed in {python}"))
                .why(if ds {
                    "DeepSpeed's builders then JIT-build DeepSpeed's own C++ async_io (libaio-dev and a compiler \
                     needed)"
                } else {
                    "import deepnvme fails in this Python"
                })
                .fix(format!(
                    "{python} -m pip install --no-build-isolation <deepnvme checkout>/bindings, or the prebuilt \
                     abi3 wheel (bindings/wheel/build.sh)"
                )),
        );
        return out;
    }
    let build = p.raw.get("build_info").filter(|b| b.is_object());
    let compiled = p.raw.get("compiled_installed").and_then(Value::as_bool).unwrap_or(false);
    out.push(Finding::ok(
        SECTION,
        "deepnvme",
        format!(
            "{} at {}; {}",
            p.str("deepnvme").unwrap_or("?"),
            p.str("deepnvme_dir").unwrap_or("?"),
            match (compiled, build) {
                (false, _) => "no compiled modules (a wheel-only install: the pyo3 front end)".to_string(),
                (true, Some(b)) => format!(
                    "compiled modules built for torch {} ({})",
                    b.get("torch").and_then(Value::as_str).unwrap_or("?"),
                    b.get("pybind11").and_then(Value::as_str).unwrap_or("pybind11 unknown")
                ),
                (true, None) => "compiled modules without a build record".to_string(),
            }
        ),
    ));

    // The hook that makes DeepSpeed's builders load deepnvme.
    let ds = p.str("deepspeed");
    let hook_off = p.raw.get("env").and_then(|e| e.get("DEEPNVME_DEEPSPEED_HOOK")).and_then(Value::as_str) == Some("0");
    let pth = p.raw.get("hook_pth").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    out.push(match (ds, pth, hook_off) {
        (None, _, _) => Finding::ok(SECTION, "hook", "no DeepSpeed here")
            .why("deepnvme.aio_handle, pin_handle and gds_handle serve Python directly"),
        (Some(_), false, _) => Finding::warn(SECTION, "hook", "deepnvme-deepspeed.pth is missing")
            .why("without it DeepSpeed's builders never load deepnvme")
            .fix(format!("reinstall deepnvme into {python}")),
        (Some(_), true, true) => Finding::warn(SECTION, "hook", "DEEPNVME_DEEPSPEED_HOOK=0 turns it off")
            .why("DeepSpeed's builders load DeepSpeed's own C++ ops")
            .fix("unset DEEPNVME_DEEPSPEED_HOOK"),
        (Some(_), true, false) => Finding::ok(SECTION, "hook", "installed and active")
            .why("DeepSpeed's async_io, pin_memory and gds builders load deepnvme"),
    });

    // Which front end, and why.
    let choice = p.raw.get("choice").and_then(Value::as_array);
    let frontend = choice.and_then(|c| c.first()).and_then(Value::as_str);
    let reason = choice.and_then(|c| c.get(1)).and_then(Value::as_str).unwrap_or("");
    let mismatch = p.raw.get("mismatch").and_then(Value::as_str);
    let forced = p
        .raw
        .get("env")
        .and_then(|e| e.get("DEEPNVME_FRONTEND"))
        .and_then(Value::as_str)
        .filter(|v| !v.trim().is_empty());
    let loads = p.raw.get("deepspeed_loads").and_then(|l| l.get("name")).and_then(Value::as_str);
    let loads_note = loads.map(|n| format!("; DeepSpeed's AsyncIOBuilder().load() returns {n}")).unwrap_or_default();
    let pyo3 = format!("pyo3 (deepnvme.frontend), not the compiled modules{loads_note}");
    let forcing = forced.map(|f| format!("DEEPNVME_FRONTEND={f} ")).unwrap_or_default();
    let f = match (frontend, p.error("choice")) {
        (_, Some(e)) => Finding::fail(SECTION, "front end", "deepnvme.choose_frontend() raised")
            .why(e.to_string())
            .fix(format!("reinstall deepnvme into {python}")),
        (Some("compiled"), None) if mismatch.is_some() => {
            Finding::fail(SECTION, "front end", format!("{forcing}forces the compiled modules, which do not match"))
                .why(format!(
                    "{}: loading them fails (undefined symbols) or misbehaves{loads_note}",
                    mismatch.unwrap_or("")
                ))
                .fix(format!("{}; or unset DEEPNVME_FRONTEND to fall back to the pyo3 front end", rebuild(&python)))
        }
        (Some("compiled"), None) => {
            let what = format!("compiled (DeepSpeed's own bindings on the Rust core){loads_note}");
            Finding::ok(SECTION, "front end", what).why(reason.to_string())
        }
        (Some("pyo3"), None) if forced.is_none() && compiled && mismatch.is_some() => {
            Finding::warn(SECTION, "front end", pyo3)
                .why(format!(
                    "the compiled modules are mismatched: {}; DeepSpeed still works, through the pyo3 front end, \
                     and says so on stderr",
                    mismatch.unwrap_or(reason)
                ))
                .fix(format!("{}; or set DEEPNVME_FRONTEND=pyo3 to choose pyo3 on purpose", rebuild(&python)))
        }
        (Some("pyo3"), None) if forced.is_none() && compiled => {
            Finding::warn(SECTION, "front end", pyo3).why(reason.to_string()).fix(rebuild(&python))
        }
        (Some(other), None) => {
            Finding::ok(SECTION, "front end", format!("{other}{loads_note}")).why(reason.to_string())
        }
        (None, None) => Finding::warn(SECTION, "front end", "unknown")
            .why("the probe did not report a choice")
            .fix(format!("{python} -c 'import deepnvme; print(deepnvme.choose_frontend())' shows why")),
    };
    out.push(f);
    if let Some(e) = p.error("deepspeed_loads") {
        // With the hook off (or deepnvme absent) the builder JIT-builds
        // DeepSpeed's own C++ op, which needs libaio's headers, ninja and a
        // C++ compiler on this machine.
        let own_op = hook_off || !pth;
        let fix = if own_op {
            format!(
                "DeepSpeed's own async_io op is JIT-built here and needs: libaio's headers (apt-get install \
                 libaio-dev, or dnf install libaio-devel), ninja on PATH ({python} -m pip install ninja, or the \
                 venv's bin on PATH), and a C++ compiler (apt-get install g++); `ds_report` then shows async_io \
                 compatible. Or let deepnvme serve it: {}",
                if hook_off { "unset DEEPNVME_DEEPSPEED_HOOK" } else { "reinstall deepnvme (its .pth hook)" }
            )
        } else {
            "see the error; `ds_report` shows what DeepSpeed sees".to_string()
        };
        out.push(
            Finding::fail(SECTION, "DeepSpeed", "AsyncIOBuilder().load() raises")
                .why(if own_op {
                    format!(
                        "{e}; with {} DeepSpeed builds its own C++ op",
                        if hook_off { "the hook off" } else { "no hook" }
                    )
                } else {
                    e.to_string()
                })
                .fix(fix),
        );
    }
    out
}
