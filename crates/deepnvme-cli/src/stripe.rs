//! `deepnvme stripe`: make, describe and remove stripe sets (one folder
//! whose files keep their bytes on several drives), stream a striped
//! file's bytes out (`cat`) and copy files by their bytes (`cp`).

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde::Serialize;

use crate::args::{fmt_size, fmt_size_approx, parse_positive_size_u64, CliError};
use crate::bench::{path_str, print_json};
use crate::core_api::{copy_file, stripe, FileTarget, HandleConfig, IoHandle, LockedBuffer};

pub const ABOUT: &str = "Stripe one folder (an nvme_path) over several drives: create, inspect, remove, cat, cp";

pub const LONG_ABOUT: &str = "\
Makes one folder (DeepSpeed's nvme_path) a stripe set over member folders on
several drives, with no RAID: every file deepnvme writes under the folder
keeps its bytes in the members, stripe unit by stripe unit in turn, and is
read and written at the members' combined speed. The folder keeps a
placeholder of each file's size, so DeepSpeed's own handling of its swap
folders works as it is. The set is declared once, in a manifest in the
folder (.deepnvme-stripe): every process, rank and tool sees it.";

pub const AFTER_HELP: &str = "\
Example, two NVMe drives mounted at /mnt/nvme0 and /mnt/nvme1:
  deepnvme stripe create /local/nvme_swap /mnt/nvme0/stripe /mnt/nvme1/stripe
  deepnvme doctor --config ds_config.json     # its nvme_path: /local/nvme_swap
  deepnvme stripe cat /local/nvme_swap/ckpt/model.pt > model.pt
  deepnvme stripe cp /local/nvme_swap/ckpt/model.pt /backup/model.pt";

#[derive(Args, Debug)]
pub struct StripeArgs {
    #[command(subcommand)]
    command: StripeCommand,
}

#[derive(Subcommand, Debug)]
enum StripeCommand {
    /// Make NVME_PATH a stripe set over MEMBER folders (made if missing; each empty)
    Create(CreateArgs),
    /// Describe a stripe set (its folder) or one striped file
    Inspect(InspectArgs),
    /// Remove a stripe set: its manifest, member markers and member files
    Remove(RemoveArgs),
    /// Write a file's logical bytes to stdout (a striped file's, from its members)
    Cat(CatArgs),
    /// Copy a file by its logical bytes (cp and rsync copy no bytes of a striped file)
    Cp(CpArgs),
}

#[derive(Args, Debug)]
struct CreateArgs {
    /// The folder to stripe (DeepSpeed's nvme_path)
    nvme_path: PathBuf,
    /// Member folders, one per drive, in stripe order
    #[arg(required = true, num_args = 1..)]
    members: Vec<PathBuf>,
    /// Stripe unit: bytes each member gets in turn (a multiple of 4 KiB)
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_positive_size_u64)]
    unit: u64,
    /// One JSON object on stdout instead of text
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// A stripe set's folder, or a file in one
    path: PathBuf,
    /// One JSON object on stdout instead of text
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct RemoveArgs {
    /// The stripe set's folder
    nvme_path: PathBuf,
    /// Delete the striped files in it too (else a set with files is refused)
    #[arg(long)]
    delete_files: bool,
}

#[derive(Args, Debug)]
struct CatArgs {
    /// The file to write to stdout
    file: PathBuf,
}

#[derive(Args, Debug)]
struct CpArgs {
    /// The file to copy (striped or not)
    source: PathBuf,
    /// The copy: a file, or a folder to copy into (striped when in a stripe set)
    dest: PathBuf,
}

pub fn main(args: StripeArgs) -> Result<(), CliError> {
    match args.command {
        StripeCommand::Create(a) => create(a),
        StripeCommand::Inspect(a) => inspect(a),
        StripeCommand::Remove(a) => remove(a),
        StripeCommand::Cat(a) => cat(a),
        StripeCommand::Cp(a) => cp(a),
    }
}

#[derive(Serialize)]
struct SetJson {
    command: &'static str,
    path: String,
    id: String,
    unit: u64,
    members: Vec<MemberJson>,
    files: usize,
    logical_bytes: u64,
    foreign_files: Vec<String>,
    orphan_files: usize,
    orphan_bytes: u64,
}

#[derive(Serialize)]
struct MemberJson {
    index: usize,
    path: String,
    ok: bool,
    problem: Option<String>,
    device: Option<String>,
    free_bytes: Option<u64>,
    total_bytes: Option<u64>,
    used_bytes: u64,
}

#[derive(Serialize)]
struct FileJson {
    command: &'static str,
    path: String,
    set: String,
    id: String,
    unit: u64,
    size: u64,
    extent: u64,
    members: Vec<FileMemberJson>,
    problems: Vec<String>,
}

#[derive(Serialize)]
struct FileMemberJson {
    path: String,
    size: Option<u64>,
    needs: u64,
}

fn create(a: CreateArgs) -> Result<(), CliError> {
    let manifest = stripe::Manifest::create(&a.nvme_path, &a.members, &stripe::CreateOptions { unit: a.unit })
        .map_err(CliError::NotRun)?;
    if a.json {
        return inspect(InspectArgs { path: manifest.root, json: true });
    }
    println!(
        "{} is a stripe set over {} member{}, unit {} (id {}):",
        manifest.root.display(),
        manifest.members.len(),
        if manifest.members.len() == 1 { "" } else { "s" },
        fmt_size(manifest.unit),
        manifest.id
    );
    for (i, m) in manifest.members.iter().enumerate() {
        println!("  member {i}: {}", m.display());
    }
    println!("Files deepnvme writes under it are striped; `deepnvme doctor` checks the members.");
    Ok(())
}

fn set_json(info: &stripe::SetInfo) -> SetJson {
    SetJson {
        command: "stripe inspect",
        path: path_str(&info.manifest.root),
        id: info.manifest.id.clone(),
        unit: info.manifest.unit,
        members: info
            .members
            .iter()
            .map(|m| MemberJson {
                index: m.index,
                path: path_str(&m.path),
                ok: m.marker.is_ok(),
                problem: m.marker.clone().err(),
                device: m.device.map(|(a, b)| format!("{a}:{b}")),
                free_bytes: m.free_bytes,
                total_bytes: m.total_bytes,
                used_bytes: m.used_bytes,
            })
            .collect(),
        files: info.files.len(),
        logical_bytes: info.files.iter().map(|f| f.1).sum(),
        foreign_files: info.foreign_files.iter().map(|p| path_str(p)).collect(),
        orphan_files: info.orphans.len(),
        orphan_bytes: info.orphans.iter().map(|o| o.1).sum(),
    }
}

fn inspect(a: InspectArgs) -> Result<(), CliError> {
    let is_set = a.path.join(stripe::Manifest::FILE_NAME).exists();
    if is_set {
        let info = stripe::SetInfo::read(&a.path).map_err(CliError::NotRun)?;
        let j = set_json(&info);
        // Exit status 1 when a member has a problem, as for a striped file.
        let troubled = j.members.iter().filter(|m| m.problem.is_some()).count();
        let verdict = || match troubled {
            0 => Ok(()),
            n => Err(CliError::Failed(format!("{n} of the {} members of {} have a problem", j.members.len(), j.path))),
        };
        if a.json {
            print_json(&j)?;
            return verdict();
        }
        println!(
            "stripe set {} (id {}, unit {}, {} members)",
            j.path,
            j.id,
            fmt_size(j.unit),
            j.members.len()
        );
        for m in &j.members {
            let state = match &m.problem {
                None => "ok".to_string(),
                Some(p) => format!("PROBLEM: {p}"),
            };
            let space = match (m.free_bytes, m.total_bytes) {
                (Some(f), Some(t)) => format!(", {} free of {}", fmt_size_approx(f), fmt_size_approx(t)),
                _ => String::new(),
            };
            println!(
                "  member {}: {} ({state}; device {}{space}; {} in member files)",
                m.index,
                m.path,
                m.device.as_deref().unwrap_or("?"),
                fmt_size(m.used_bytes)
            );
        }
        println!("  {} striped files, {} in all", j.files, fmt_size(j.logical_bytes));
        if !j.foreign_files.is_empty() {
            println!("  {} files of another set (made again over them; unreadable): {}", j.foreign_files.len(), j.foreign_files.join(", "));
        }
        if j.orphan_files > 0 {
            println!(
                "  {} member files ({}) belong to no file here (left by removed folders; `deepnvme stripe remove` clears them)",
                j.orphan_files,
                fmt_size(j.orphan_bytes)
            );
        }
        return verdict();
    }
    let info = stripe::FileInfo::read(&a.path).map_err(CliError::NotRun)?;
    let Some(info) = info else {
        return Err(CliError::NotRun(format!(
            "{} is neither a stripe set's folder nor a striped file",
            a.path.display()
        )));
    };
    let j = FileJson {
        command: "stripe inspect",
        path: path_str(&info.path),
        set: path_str(&info.root),
        id: info.id.clone(),
        unit: info.layout.unit,
        size: info.size,
        extent: info.extent,
        members: info
            .members
            .iter()
            .map(|(p, s, n)| FileMemberJson { path: path_str(p), size: *s, needs: *n })
            .collect(),
        problems: info.problems.clone(),
    };
    let verdict = || match j.problems.is_empty() {
        true => Ok(()),
        false => Err(CliError::Failed(format!("{} does not agree with its stripe set", j.path))),
    };
    if a.json {
        print_json(&j)?;
        return verdict();
    }
    println!("{}: striped file of the set at {} (id {}, unit {})", j.path, j.set, j.id, fmt_size(j.unit));
    println!("  {} bytes; the first {} in the members{}", j.size, j.extent, if j.size > j.extent { ", the rest in the file itself" } else { "" });
    for (i, m) in j.members.iter().enumerate() {
        let size = m.size.map_or("missing".to_string(), |s| format!("{s} bytes"));
        println!("  member {i}: {} ({size}; needs {})", m.path, m.needs);
    }
    for p in &j.problems {
        println!("  PROBLEM: {p}");
    }
    verdict()
}

fn remove(a: RemoveArgs) -> Result<(), CliError> {
    let report = stripe::Manifest::remove(&a.nvme_path, a.delete_files).map_err(CliError::NotRun)?;
    println!(
        "removed the stripe set at {} ({} striped files and {} member files deleted)",
        a.nvme_path.display(),
        report.files_deleted,
        report.member_files_deleted
    );
    Ok(())
}

/// The chunk `cat` reads at a time.
const CAT_CHUNK: usize = 64 << 20;

fn cat(a: CatArgs) -> Result<(), CliError> {
    let size = std::fs::metadata(&a.file).map_err(|e| CliError::NotRun(format!("{}: {e}", a.file.display())))?.len();
    let handle = IoHandle::new(HandleConfig {
        block_size: 1 << 20,
        queue_depth: 32,
        intra_op_parallelism: 1,
        ..HandleConfig::default()
    })
    .map_err(|e| CliError::Failed(e.to_string()))?;
    let chunk = (size as usize).clamp(1, CAT_CHUNK);
    // Locked memory moves without a copy; without enough RLIMIT_MEMLOCK,
    // plain memory works too.
    let mut locked = LockedBuffer::new(chunk).ok();
    let mut plain = if locked.is_none() { vec![0u8; chunk] } else { Vec::new() };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut offset = 0u64;
    while offset < size {
        let n = ((size - offset) as usize).min(chunk);
        let buf: &mut [u8] = match &mut locked {
            Some(b) => &mut b[..n],
            None => &mut plain[..n],
        };
        handle.read_into(buf, FileTarget::Path(&a.file), offset).map_err(|e| CliError::Failed(e.to_string()))?;
        if let Err(e) = out.write_all(buf) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(CliError::Failed(format!("writing to stdout: {e}")));
        }
        offset += n as u64;
    }
    out.flush().map_err(|e| CliError::Failed(format!("writing to stdout: {e}")))?;
    Ok(())
}

fn cp(a: CpArgs) -> Result<(), CliError> {
    let dest = match (a.dest.is_dir(), a.source.file_name()) {
        (true, Some(name)) => a.dest.join(name),
        _ => a.dest,
    };
    copy_file(&a.source, &dest).map_err(|e| CliError::Failed(e.to_string()))?;
    Ok(())
}
