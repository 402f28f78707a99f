//! The `stripe` section, for each folder that is (or is inside) a stripe
//! set (`deepnvme stripe create`): the manifest reads; every member folder
//! is present with its marker, writable and O_DIRECT-capable; members are
//! on distinct drives (two on one drive share its bandwidth: a WARN); each
//! member has room for its share of the swap files; the folder's file
//! system keeps user extended attributes (the placeholders' marks); member
//! files that no file refers to any more. Plain folders get no findings.

use std::path::{Path, PathBuf};

use super::filesystem::{needed, space};
use super::report::Finding;
use super::{Context, Target};
use crate::args::fmt_size_approx;
use crate::core_api::stripe;
use crate::info::{probe_dio, Dio};

const SECTION: &str = "stripe";

/// The stripe set `dir` is in (its folder), if any.
pub fn set_root(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().find(|d| d.join(stripe::Manifest::FILE_NAME).exists()).map(Path::to_path_buf)
}

/// The whole disk a device number belongs to (a partition's parent), as
/// sysfs names it: two partitions of one drive share its bandwidth.
fn disk_of(dev: (u32, u32)) -> String {
    let link = PathBuf::from(format!("/sys/dev/block/{}:{}", dev.0, dev.1));
    match std::fs::canonicalize(&link) {
        Ok(real) if real.join("partition").exists() => {
            real.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        }
        Ok(real) => real.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        // Not a block device (tmpfs, overlay): its own device number.
        Err(_) => format!("{}:{}", dev.0, dev.1),
    }
}

pub fn check_target(ctx: &Context, t: &Target) -> Vec<Finding> {
    let Some(root) = set_root(&t.probe_dir) else { return Vec::new() };
    let info = match stripe::SetInfo::read(&root) {
        Ok(i) => i,
        Err(e) => {
            return vec![Finding::fail(SECTION, "manifest", format!("{}: {e}", root.display()))
                .why("every op on a file under the folder reads this manifest, and fails while it cannot")
                .fix(format!("fix or remove {} (`deepnvme stripe remove`)", root.join(stripe::Manifest::FILE_NAME).display()))]
        }
    };
    let m = &info.manifest;
    let n = m.members.len();
    let mut out = vec![Finding::ok(
        SECTION,
        "manifest",
        format!("{} is a stripe set over {n} members, unit {} (id {})", root.display(), fmt_size_approx(m.unit), m.id),
    )
    .why("files deepnvme writes under it keep their bytes in the members, a unit on each in turn")];

    if let Err(e) = stripe::Manifest::check_xattrs(&root) {
        out.push(
            Finding::fail(SECTION, "placeholder marks", format!("{}: no user extended attributes ({e})", root.display()))
                .why("a striped file's placeholder is marked with the attribute user.deepnvme.stripe")
                .fix("put the striped folder on ext4, xfs, btrfs or tmpfs"),
        );
    }

    for member in &info.members {
        let name = format!("member {}", member.index);
        let dir = &member.path;
        if let Err(why) = &member.marker {
            out.push(
                Finding::fail(SECTION, "member", format!("{name} {}: {why}", dir.display()))
                    .why("ops on striped files fail, naming this member, until it is back")
                    .fix("mount the member's drive at its folder (or recreate the set: `deepnvme stripe remove`, `create`)"),
            );
            continue;
        }
        match probe_dio(dir) {
            Dio::Aligned { offset, .. } => out.push(
                Finding::ok(SECTION, "member", format!("{name} {}: writable, O_DIRECT (alignment {offset} B)", dir.display())),
            ),
            Dio::Unsupported => out.push(
                Finding::warn(SECTION, "member", format!("{name} {}: writable, but no O_DIRECT", dir.display()))
                    .why("every member moves bytes buffered (through the page cache) when one has no O_DIRECT")
                    .fix("put the member on a file system with O_DIRECT (ext4, xfs)"),
            ),
            Dio::Unknown(why) => out.push(
                Finding::fail(SECTION, "member", format!("{name} {}: not writable: {why}", dir.display()))
                    .why("writes of striped files fail on this member")
                    .fix("make the member folder writable for the job's user"),
            ),
        }
    }

    // Distinct drives: members on one disk share its bandwidth.
    let disks: Vec<(usize, String)> = info
        .members
        .iter()
        .filter_map(|mi| mi.device.map(|d| (mi.index, disk_of(d))))
        .collect();
    let mut shared = Vec::new();
    for (i, (a, da)) in disks.iter().enumerate() {
        for (b, db) in &disks[i + 1..] {
            if da == db {
                shared.push(format!("members {a} and {b} ({da})"));
            }
        }
    }
    if shared.is_empty() {
        let names: Vec<&str> = disks.iter().map(|(_, d)| d.as_str()).collect();
        out.push(Finding::ok(SECTION, "distinct drives", format!("members on {}", names.join(", "))));
    } else {
        out.push(
            Finding::warn(SECTION, "distinct drives", format!("{} are on one drive", shared.join(", ")))
                .why("members on one drive share its bandwidth: the set is no faster than fewer members")
                .fix("give each member a folder on a drive of its own"),
        );
    }

    // Room: each member holds about 1/N of the swap files.
    let (need, what) = needed(ctx, t);
    let share = need.div_ceil(n as u64) + m.unit;
    for member in info.members.iter().filter(|mi| mi.marker.is_ok()) {
        let Some((free, total)) = space(&member.path) else { continue };
        let summary = format!("member {}: {} free of {}", member.index, fmt_size_approx(free), fmt_size_approx(total));
        let f = if free < share {
            Finding::fail(SECTION, "free space", summary)
                .why(format!("about {} (1/{n} of {what}) go to each member", fmt_size_approx(share)))
                .fix("free space on that member's drive")
        } else {
            Finding::ok(SECTION, "free space", summary).why(format!("room for its 1/{n} share of {what}"))
        };
        out.push(f);
    }

    if !info.foreign_files.is_empty() {
        out.push(
            Finding::warn(SECTION, "files", format!("{} files were striped by another set", info.foreign_files.len()))
                .why("the set was made again over them: their bytes cannot be read")
                .fix("remove them; DeepSpeed writes its swap files afresh"),
        );
    }
    let orphan_bytes: u64 = info.orphans.iter().map(|o| o.1).sum();
    if orphan_bytes > 0 {
        out.push(
            Finding::warn(
                SECTION,
                "files",
                format!("{} member files ({}) belong to no file of the set", info.orphans.len(), fmt_size_approx(orphan_bytes)),
            )
            .why("left when a folder of striped files was removed and no file of those names was written since")
            .fix(format!("`deepnvme stripe inspect {}` lists them; `deepnvme stripe remove` clears a set", root.display())),
        );
    }
    out
}

pub fn check(ctx: &Context) -> Vec<Finding> {
    ctx.per_target(check_target)
}
