//! The `gds` section: whether GPUDirect Storage can work, through the
//! core's own probe (libcufile and libcuda found as the core finds them,
//! `cuInit`, a device, `cuFileDriverOpen`), and as a DeepSpeed process sees
//! it (torch loaded, whose libcufile the core then finds: asked of the
//! Python the frontend section runs); how transfers would go: nvidia-fs,
//! PCI P2PDMA or cuFile's compatibility mode (POSIX I/O through bounce
//! buffers); and the cuFile config in use (`/etc/cufile.json`, comments
//! allowed). Failures are failures only when the config asks for GDS
//! (`aio.use_gds`) or `DEEPNVME_CUFILE_LIB` names a library.

use std::path::PathBuf;

use serde_json::Value;

use super::report::{Finding, Status};
use super::Context;
use crate::core_api::{self, GdsError, GdsLibrary};

const SECTION: &str = "gds";
const SYSTEM_CONFIG: &str = "/etc/cufile.json";

/// Drops `//` and `/* */` comments outside strings: NVIDIA's cufile.json
/// has them, and JSON does not.
pub fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut prev = ' ';
                for n in chars.by_ref() {
                    if prev == '*' && n == '/' {
                        break;
                    }
                    prev = n;
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The cuFile config cuFile would read: `CUFILE_ENV_PATH_JSON`, else
/// /etc/cufile.json; parsed, or why not.
fn cufile_config() -> (Option<PathBuf>, Result<Value, String>) {
    let path = std::env::var_os(core_api::CUFILE_ENV_PATH_JSON)
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from(SYSTEM_CONFIG)).filter(|p| p.exists()));
    let Some(path) = path else { return (None, Err("none".into())) };
    let parsed = std::fs::read_to_string(&path).map_err(|e| e.to_string()).and_then(|t| {
        serde_json::from_str(&strip_comments(&t)).map_err(|e| format!("not JSON even without comments: {e}"))
    });
    (Some(path), parsed)
}

fn property(cfg: &Value, key: &str) -> Option<bool> {
    cfg.get("properties")?.get(key)?.as_bool()
}

/// What is missing, in a phrase: the whole message (every name tried) is
/// for when GDS is wanted.
fn short(e: &GdsError) -> String {
    match e {
        GdsError::LibraryNotFound { library, .. } => format!("{} not found", library.short_name()),
        GdsError::Several(v) => v.iter().map(short).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// What to do about a library or driver error.
fn fix_for(e: &GdsError, candidates: &[String]) -> String {
    match e {
        GdsError::LibraryNotFound { library: GdsLibrary::CuFile, override_var: Some(var), .. } => format!(
            "point {var} at a libcufile that exists ({}), or unset it to search the default names",
            candidates.first().map(String::as_str).unwrap_or("e.g. /usr/local/cuda/lib64/libcufile.so.0")
        ),
        GdsError::LibraryNotFound { library: GdsLibrary::CuFile, .. } => match candidates.first() {
            Some(c) => format!(
                "this Python's torch ships one: export {}={c} (a DeepSpeed process finds it anyway, through torch)",
                core_api::CUFILE_LIB_ENV
            ),
            None => format!(
                "install cuFile: pip install nvidia-cufile-cu12 (or the CUDA 13 build your torch uses), or NVIDIA's \
                 GDS packages (apt install nvidia-gds); then make it findable (LD_LIBRARY_PATH) or set \
                 {}=/path/to/libcufile.so.0",
                core_api::CUFILE_LIB_ENV
            ),
        },
        GdsError::LibraryNotFound { library: GdsLibrary::Cuda, .. } => {
            "install the NVIDIA driver (nvidia-smi must work); in a container, start it with --gpus all (NVIDIA \
             Container Toolkit)"
                .into()
        }
        GdsError::MissingSymbol { .. } => "install a newer cuFile (CUDA 12 or later)".into(),
        GdsError::Cuda { .. } => "check the NVIDIA driver: nvidia-smi must list the GPU".into(),
        GdsError::NoDevice { .. } => "make a GPU visible: CUDA_VISIBLE_DEVICES, or --gpus for a container".into(),
        GdsError::Several(v) => v.iter().map(|e| fix_for(e, candidates)).collect::<Vec<_>>().join("; and "),
        _ => "see cuFile's log (CUFILE_LOGFILE_PATH) and `gdscheck -p` from NVIDIA's GDS tools".into(),
    }
}

/// Whether this machine has an NVIDIA GPU: the driver lists one
/// (`/proc/driver/nvidia/gpus`), or its device node is there (`/dev/nvidiaN`,
/// which a container given a GPU has). The one answer for every section:
/// the config section asks it for DeepSpeed's accelerator, this one for
/// the fix without a GPU.
pub fn has_gpu() -> bool {
    let listed = std::fs::read_dir("/proc/driver/nvidia/gpus").is_ok_and(|mut d| d.next().is_some());
    let node = std::fs::read_dir("/dev").is_ok_and(|d| {
        d.flatten().any(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix("nvidia").is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
        })
    });
    listed || node
}

const NO_GPU_FIX: &str = "there is no GPU here, and GDS moves data between NVMe and GPU memory: set \"use_gds\": \
                          false in the config's aio block (the CPU path through aio_handle needs no GPU)";

pub fn check(ctx: &Context) -> Vec<Finding> {
    let requested = ctx.config.as_ref().is_some_and(|c| c.aio.use_gds);
    let gpu = has_gpu();
    let override_set = std::env::var_os(core_api::CUFILE_LIB_ENV).is_some();
    let why_needed = if requested {
        "the config sets aio.use_gds: DeepSpeed's GDSBuilder().load().gds_handle fails without it".to_string()
    } else if override_set {
        format!("{} is set, so GDS is meant to be used", core_api::CUFILE_LIB_ENV)
    } else {
        "only aio.use_gds needs it; everything else runs without".to_string()
    };
    let mut out = Vec::new();
    let mut usable = false;
    match core_api::gds_environment() {
        Ok(found) => {
            out.push(Finding::ok(SECTION, "libraries", found));
            match core_api::gds_probe() {
                Ok(()) => {
                    usable = true;
                    out.push(Finding::ok(SECTION, "driver", "cuFileDriverOpen succeeded"));
                }
                Err(e) => {
                    let status = if requested { Status::Fail } else { Status::Warn };
                    let fix = if requested && !gpu {
                        format!("{NO_GPU_FIX}; on a GPU machine: {}", fix_for(&e, &[]))
                    } else {
                        fix_for(&e, &[])
                    };
                    out.push(
                        Finding::new(SECTION, "driver", status, "the cuFile driver does not open")
                            .why(e.to_string())
                            .fix(fix),
                    );
                }
            }
        }
        Err(e) => {
            // A DeepSpeed process has torch loaded, whose libcufile the core
            // then finds by soname: ask such a process before failing.
            let py = if requested || override_set { ctx.python() } else { None };
            let torch_view = py.and_then(|p| p.gds.clone());
            let candidates = py.map(|p| p.cufile_candidates.clone()).unwrap_or_default();
            let status = match &torch_view {
                Some(Ok(())) => Status::Ok,
                _ if requested || override_set => Status::Fail,
                _ => Status::Ok,
            };
            let summary = match &torch_view {
                Some(Ok(())) => {
                    "not found by this tool, but a Python process with torch finds and opens it".to_string()
                }
                _ => "GPUDirect Storage is not available".to_string(),
            };
            let wanted = requested || override_set;
            let mut why = if wanted { format!("{e}; {why_needed}") } else { format!("{}; {why_needed}", short(&e)) };
            if let Some(Err(py_reason)) = &torch_view {
                why.push_str(&format!("; with torch loaded, {}", py_reason));
            }
            usable = matches!(torch_view, Some(Ok(())));
            let mut f = Finding::new(SECTION, "libraries", status, summary).why(why);
            if status != Status::Ok {
                f = f.fix(if requested && !gpu {
                    format!("{NO_GPU_FIX}; on a GPU machine: {}", fix_for(&e, &candidates))
                } else {
                    fix_for(&e, &candidates)
                });
            }
            out.push(f);
        }
    }

    // How transfers would go, when GDS can run or is wanted.
    let (cfg_path, cfg) = cufile_config();
    let nvfs = std::path::Path::new("/sys/module/nvidia_fs").exists();
    let nvfs_version = std::fs::read_to_string("/proc/driver/nvidia-fs/version")
        .ok()
        .map(|v| v.lines().next().unwrap_or("").trim().to_string());
    let p2p = cfg.as_ref().ok().and_then(|c| property(c, "use_pci_p2pdma")).unwrap_or(false);
    let compat_allowed = cfg.as_ref().ok().and_then(|c| property(c, "allow_compat_mode"));
    let forced_compat = std::env::var("CUFILE_FORCE_COMPAT_MODE").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    // Without a GPU, how transfers would go is moot (the fix says use_gds false).
    if (usable || requested) && gpu {
        let mode = if forced_compat {
            Err("CUFILE_FORCE_COMPAT_MODE=true forces compatibility mode".to_string())
        } else if nvfs {
            Ok(format!(
                "nvidia-fs{} is loaded: GPUDirect transfers",
                nvfs_version.map(|v| format!(" ({v})")).unwrap_or_default()
            ))
        } else if p2p {
            Ok("use_pci_p2pdma is on in the cuFile config: GPUDirect through the kernel's PCI P2PDMA".to_string())
        } else {
            Err("neither nvidia-fs is loaded nor use_pci_p2pdma set".to_string())
        };
        const ENABLE: &str = "modprobe nvidia-fs (NVIDIA's nvidia-gds package), or set \"properties\": \
                              {\"use_pci_p2pdma\": true} in the cuFile config (kernel 6.2+, open GPU driver)";
        out.push(match mode {
            Ok(m) => Finding::ok(SECTION, "mode", m),
            Err(why) if compat_allowed == Some(false) => {
                Finding::fail(SECTION, "mode", "no GPUDirect path, and compatibility mode is off")
                    .why(format!("{why}; allow_compat_mode is false, so cuFile refuses the files"))
                    .fix(format!("{ENABLE}; or set allow_compat_mode true"))
            }
            Err(why) => {
                let what = "compatibility mode: cuFile moves data with POSIX I/O through bounce buffers";
                Finding::warn(SECTION, "mode", what)
                    .why(format!("{why}; it works, but not GPUDirect: no faster than the aio path"))
                    .fix(ENABLE)
            }
        });
    }
    out.push(match (&cfg_path, &cfg) {
        (None, _) => Finding::ok(SECTION, "cufile.json", "none: cuFile's defaults").why(format!(
            "no {SYSTEM_CONFIG} and no {}; deepnvme gives the driver a private config with DeepSpeed's keys",
            core_api::CUFILE_ENV_PATH_JSON
        )),
        (Some(p), Ok(c)) => Finding::ok(SECTION, "cufile.json", p.display().to_string()).why(format!(
            "allow_compat_mode {}, use_pci_p2pdma {}; it is used as is (deepnvme writes no config of its own then)",
            property(c, "allow_compat_mode").map(|b| b.to_string()).unwrap_or_else(|| "unset".into()),
            property(c, "use_pci_p2pdma").map(|b| b.to_string()).unwrap_or_else(|| "unset".into())
        )),
        (Some(p), Err(e)) => Finding::new(
            SECTION,
            "cufile.json",
            if requested { Status::Fail } else { Status::Warn },
            p.display().to_string(),
        )
        .why(format!("cuFile cannot use it: {e}"))
        .fix(format!(
            "repair {} (NVIDIA's template is in the GDS package), or point {} at a good one",
            p.display(),
            core_api::CUFILE_ENV_PATH_JSON
        )),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_go_strings_stay() {
        let text = r#"{
            // a comment with "quotes"
            "logging": { "dir": "/var/log//cufile" }, /* block
            comment */ "properties": { "allow_compat_mode": true, "s": "a\"//b" }
        }"#;
        let v: Value = serde_json::from_str(&strip_comments(text)).unwrap();
        assert_eq!(v["logging"]["dir"], "/var/log//cufile");
        assert_eq!(property(&v, "allow_compat_mode"), Some(true));
        assert_eq!(v["properties"]["s"], "a\"//b");
    }

    #[test]
    fn fixes_name_the_override_and_the_copy_torch_ships() {
        let missing = |var| GdsError::LibraryNotFound {
            library: GdsLibrary::CuFile,
            attempts: vec![],
            override_var: var,
            other: None,
        };
        let f = fix_for(&missing(Some(core_api::CUFILE_LIB_ENV)), &[]);
        assert!(f.contains(core_api::CUFILE_LIB_ENV) && f.contains("unset"), "{f}");
        let f = fix_for(&missing(None), &["/venv/nvidia/cu13/lib/libcufile.so.0".into()]);
        assert!(f.contains("=/venv/nvidia/cu13/lib/libcufile.so.0"), "{f}");
        assert!(fix_for(&missing(None), &[]).contains("pip install nvidia-cufile"));
    }
}
