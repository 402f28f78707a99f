//! The `buffers` section: the config's swap buffers against the model
//! (`--model-params`, `--largest-param`, `--world-size`, `--nodes`), by the
//! rules of DeepSpeed 0.19.8's swappers, each finding naming the error it
//! prevents and giving the numbers to write:
//!
//! * `buffer_size`: zero.Init gives every parameter whose partition (its
//!   elements over the data-parallel ranks) is swappable (at least
//!   max(1 MiB, block_size) bytes) a swap buffer, and `get_buffer` asserts
//!   "More elements N than buffer size B" when it does not fit (#3506).
//!   With `fast_init`, the optimizer swapper fills its fp32 sub-groups
//!   through those buffers: "numel of fp16 buffers ... is too small".
//! * `buffer_count`: a gathered parameter keeps its swap buffer until it is
//!   released, and ZeRO-3 keeps every parameter it will reuse within
//!   `stage3_max_reuse_distance` elements; at the turn from forward to
//!   backward that is the last reuse-distance/2 elements of the model. Each
//!   holds at most the largest parameter, so at least
//!   floor(min(model, reuse/2) / largest) buffers are held at once, and a
//!   swap-in with none left asserts "Not enough buffers" (#3062). That
//!   assumes every element in the window is in a parameter big enough to be
//!   swapped (its partition at least max(1 MiB, block_size)); over many
//!   ranks a transformer's smaller weights are not, so there the shortfall
//!   is a WARN (see [`DOUBT_SHARE`]).
//! * the optimizer's `buffer_count`: swapping a sub-group in takes a buffer
//!   per state tensor (Adam: the fp32 parameter, exp_avg, exp_avg_sq) and
//!   one for its gradient; the pipelined swapper holds the next and the
//!   previous sub-group's too.

use super::config::DsConfig;
use super::report::Finding;
use super::Context;
use crate::args::fmt_size_approx;

const SECTION: &str = "buffers";
/// `swap_tensor/utils.py` `MIN_AIO_BYTES`: smaller partitions stay in CPU memory.
const MIN_AIO_BYTES: u64 = 1 << 20;

/// The buffer_count rule counts every element of the reuse window as in a
/// swapped parameter. Over dp ranks only parameters of dp x
/// max(1 MiB, block_size) bytes or more are swapped; once that exceeds this
/// share of the largest parameter (the embedding, in a transformer), the
/// weights that hold most of a layer's elements may not be: the MLP and
/// attention matrices are 1/3 to 1/16 of the embedding in common LLMs
/// (LLaMA-2 7B 1/3, LLaMA-3 8B 1/9, OPT 1/6, GPT-2 1/16), less in small
/// models. Then a shortfall is a WARN, not a FAIL. At one rank the rule
/// stands: only parameters under max(1 MiB, block_size) stay in memory.
const DOUBT_SHARE: u64 = 16;

/// A round number at least `n`: two significant digits, as a config writes it.
fn round_up(n: u64) -> u64 {
    if n < 100 {
        return n;
    }
    let mut unit = 1u64;
    while n / unit >= 100 {
        unit *= 10;
    }
    n.div_ceil(unit) * unit
}

/// Per-step state tensors the optimizer keeps per parameter (besides the
/// parameter itself): Adam's exp_avg and exp_avg_sq; one for SGD with
/// momentum, Adagrad, Lion. Unknown types count as Adam.
fn optimizer_states(kind: Option<&str>) -> (u64, String) {
    let t = kind.unwrap_or("Adam").to_ascii_lowercase();
    let one = ["sgd", "adagrad", "lion", "rmsprop"];
    match one.iter().find(|o| t.contains(*o)) {
        Some(_) => (1, format!("{} keeps 1 state tensor per parameter", kind.unwrap_or("?"))),
        None if t.contains("adam") || t.contains("lamb") => {
            (2, format!("{} keeps 2 (exp_avg, exp_avg_sq)", kind.unwrap_or("Adam")))
        }
        None => (2, format!("{} assumed to keep 2 state tensors, as Adam", kind.unwrap_or("?"))),
    }
}

fn param_checks(ctx: &Context, cfg: &DsConfig, out: &mut Vec<Finding>) {
    let Some(p) = &cfg.param else { return };
    let m = ctx.model;
    let e = cfg.model_dtype_bytes;
    let dp = m.dp();
    let key = |k: &str| format!("{}.{k}", p.block);
    let swappable_min = MIN_AIO_BYTES.max(cfg.aio.block_size as u64).div_ceil(e);
    let lock = |count: u64, size: u64| fmt_size_approx(count * cfg.aligned_numel(size, e) * e);
    let ranks = format!("{dp} data-parallel rank(s) ({} per node x {} node(s))", m.world_size, m.nodes);

    // buffer_size against the largest parameter's partition.
    match m.largest {
        None => out.push(
            Finding::skip(SECTION, "buffer_size", format!("{} elements: not compared", p.buffer_size))
                .why("the largest parameter is not known")
                .fix(
                    "pass --largest-param N (elements of the model's largest parameter, e.g. vocab_size x \
                     hidden_size for the embedding)",
                )
                .key(key("buffer_size")),
        ),
        Some(largest) => {
            let partition = largest.div_ceil(dp);
            let summary = format!(
                "{} elements per buffer; the largest parameter's partition is {partition} elements",
                p.buffer_size
            );
            let basis = format!("{largest} elements over {ranks}, {e} B each ({})", cfg.model_dtype);
            out.push(if partition < swappable_min {
                Finding::ok(SECTION, "buffer_size", summary).why(format!(
                    "{basis}: under max(1 MiB, block_size) = {swappable_min} elements, so no partition is swapped \
                     (they stay in CPU memory)"
                ))
            } else if partition > p.buffer_size {
                let want = round_up(partition);
                Finding::fail(SECTION, "buffer_size", summary)
                    .why(format!(
                        "{basis}: zero.Init's get_buffer asserts \"More elements {partition} than buffer size {}\" \
                         when it partitions that parameter (DeepSpeed #3506)",
                        p.buffer_size
                    ))
                    .fix(format!(
                        "set {} to at least {partition} (e.g. {want}); that locks buffer_count {} x {want} x {e} B \
                         = {} per rank (see memlock), or partition over more ranks",
                        key("buffer_size"),
                        p.buffer_count,
                        lock(p.buffer_count, want)
                    ))
                    .key(key("buffer_size"))
            } else {
                Finding::ok(SECTION, "buffer_size", summary).why(format!("{basis}: it fits")).key(key("buffer_size"))
            });
        }
    }

    // buffer_count against the parameters ZeRO-3 keeps gathered.
    let reuse = cfg.max_reuse_distance;
    let smallest_swapped = dp.saturating_mul(swappable_min);
    let doubtful = dp > 1 && m.largest.is_some_and(|l| smallest_swapped.saturating_mul(DOUBT_SHARE) > l);
    let assumption = format!(
        "this assumes every element of the window is in a parameter swapped to NVMe: over {dp} rank(s), one of at \
         least {smallest_swapped} elements ({dp} x max(1 MiB, block_size) / {e} B)"
    );
    let need = match (m.params, m.largest) {
        (Some(n), Some(l)) if l.div_ceil(dp) >= swappable_min => Some((n.min(reuse / 2) / l.max(1)).max(1)),
        (Some(_), Some(_)) => Some(0),
        _ => None,
    };
    let summary = format!("{} swap buffers", p.buffer_count);
    out.push(match need {
        _ if p.buffer_count == 0 => Finding::fail(SECTION, "buffer_count", "0 swap buffers")
            .why(
                "zero.Init's get_buffer asserts \"No swap buffers to allocate for fp16 param\" for the first \
                 parameter whose partition reaches max(1 MiB, block_size)",
            )
            .fix(format!("set {} to at least 1 (DeepSpeed's default is 5)", key("buffer_count")))
            .key(key("buffer_count")),
        None => Finding::skip(SECTION, "buffer_count", format!("{summary}: not compared"))
            .why("how many parameters ZeRO-3 keeps gathered depends on the model")
            .fix("pass --model-params N and --largest-param N")
            .key(key("buffer_count")),
        Some(0) => Finding::ok(SECTION, "buffer_count", summary)
            .why("no parameter's partition is swappable, so no buffer is used")
            .key(key("buffer_count")),
        Some(need) if need > p.buffer_count => {
            let (n, l) = (m.params.unwrap_or(0), m.largest.unwrap_or(1));
            let held = n.min(reuse / 2);
            let distance = 2 * p.buffer_count.saturating_sub(1) * l;
            let rule = format!(
                "a gathered parameter keeps its swap buffer until released, and ZeRO-3 keeps those it reuses within \
                 stage3_max_reuse_distance ({reuse} elements): at the turn from forward to backward about min(model \
                 {n}, {reuse}/2) = {held} elements stay gathered, at least {held} / {l} (the largest parameter) = \
                 {need} parameters, one buffer each. The next swap-in then asserts \"Not enough buffers 0 for \
                 swapping 1\" (DeepSpeed #3062)"
            );
            let fix = format!(
                "set {} to at least {need} (locks {need} x aligned buffer_size x {e} B = {} per rank; see memlock), \
                 or lower zero_optimization.stage3_max_reuse_distance to {distance} or less so that fewer stay \
                 gathered (more NVMe reads)",
                key("buffer_count"),
                lock(need, p.buffer_size)
            );
            if doubtful {
                Finding::warn(SECTION, "buffer_count", summary).why(format!(
                    "{rule}; but {assumption}, more than 1/{DOUBT_SHARE} of the largest parameter: the model's other \
                     weights may be smaller and stay in CPU memory, holding no buffer, so fewer may do"
                ))
            } else {
                Finding::fail(SECTION, "buffer_count", summary).why(format!("{rule}; {assumption}"))
            }
            .fix(fix)
            .key(key("buffer_count"))
        }
        Some(need) => Finding::ok(SECTION, "buffer_count", summary)
            .why(format!(
                "at least {need} parameters stay gathered at once (stage3_max_reuse_distance {reuse}, the model's \
                 {} elements, the largest {}): it holds them",
                m.params.unwrap_or(0),
                m.largest.unwrap_or(0)
            ))
            .key(key("buffer_count")),
    });

    // fast_init: the optimizer's fp32 sub-groups pass through these buffers.
    if let (Some(o), Some(n)) = (&cfg.optimizer, m.params) {
        if o.fast_init {
            let sub_group = cfg.sub_group_size.min(n.div_ceil(dp));
            let fp32 = cfg.aligned_numel(sub_group, 4);
            let fp16 = cfg.aligned_numel(p.buffer_size, e);
            let summary = format!("fast_init: {fp16}-element buffers, a sub-group of at least {fp32} fp32 elements");
            out.push(if fp16 < fp32 {
                Finding::fail(SECTION, "fast_init", summary)
                    .why(format!(
                        "with fast_init the optimizer swapper initializes each fp32 sub-group (min(sub_group_size {}, \
                         {n} parameters / {dp} ranks) = {sub_group} elements or more) through the parameter swap \
                         buffers, and asserts \"numel of fp16 buffers [...] is too small for initializing fp32 \
                         params\"",
                        cfg.sub_group_size
                    ))
                    .fix(format!(
                        "set {} to at least {} , or lower zero_optimization.sub_group_size to {}, or set \
                         offload_optimizer.fast_init false",
                        key("buffer_size"),
                        round_up(sub_group),
                        p.buffer_size
                    ))
                    .key(key("buffer_size"))
            } else {
                Finding::ok(SECTION, "fast_init", summary).key(key("buffer_size"))
            });
        }
    }
}

fn optimizer_checks(ctx: &Context, cfg: &DsConfig, out: &mut Vec<Finding>) {
    let Some(o) = &cfg.optimizer else { return };
    let key = format!("{}.buffer_count", o.block);
    let (states, which) = optimizer_states(cfg.optimizer_type.as_deref());
    let base = states + 2;
    let m = ctx.model;
    let sub_groups = m.params.map(|n| n.div_ceil(m.dp()).div_ceil(cfg.sub_group_size.max(1)));
    let factor = 1 + u64::from(o.pipeline_read) + u64::from(o.pipeline_write);
    let pipelined = factor > 1;
    let (need, certain) = match sub_groups {
        Some(g) if g >= 2 && pipelined => (base * factor, true),
        Some(_) => (base, true),
        None if pipelined => (base * factor, false),
        None => (base, true),
    };
    let summary = format!("{} swap buffers", o.buffer_count);
    let why = format!(
        "swapping a sub-group in takes a buffer per state tensor ({which}, plus the fp32 parameter) and one for \
         its gradient: {base}{}",
        if pipelined {
            format!(
                "; pipeline_read/pipeline_write keep the next and the previous sub-group's too: {base} x {factor} = {}",
                base * factor
            )
        } else {
            String::new()
        }
    );
    let error = if pipelined {
        "\"PipelinedOptimizerSwapper ran out of swap buffers, try increasing 'buffer_count'\""
    } else {
        "an AssertionError in swap_in_optimizer_state (no buffers allocated)"
    };
    out.push(if o.buffer_count < base || (certain && o.buffer_count < need) {
        Finding::fail(SECTION, "optimizer buffer_count", summary)
            .why(format!("{why}; with fewer the optimizer step fails with {error}"))
            .fix(format!("set {key} to at least {need}"))
            .key(&key)
    } else if o.buffer_count < need {
        Finding::warn(SECTION, "optimizer buffer_count", summary)
            .why(format!(
                "{why}; that many are needed once a rank has more than one sub-group (sub_group_size {}), else \
                 the step fails with {error}",
                cfg.sub_group_size
            ))
            .fix(format!("set {key} to at least {need}, or pass --model-params to know the sub-groups"))
            .key(&key)
    } else {
        Finding::ok(SECTION, "optimizer buffer_count", summary).why(why).key(&key)
    });
}

pub fn check(ctx: &Context) -> Vec<Finding> {
    let Some(cfg) = ctx.config.as_ref().filter(|c| c.swaps() && c.stage == Some(3)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    param_checks(ctx, cfg, &mut out);
    optimizer_checks(ctx, cfg, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_numbers() {
        assert_eq!(round_up(524_709_888), 530_000_000);
        assert_eq!(round_up(1_000_448), 1_100_000);
        assert_eq!(round_up(1_000_000), 1_000_000);
        assert_eq!(round_up(42), 42);
    }

    #[test]
    fn optimizer_state_counts() {
        assert_eq!(optimizer_states(Some("AdamW")).0, 2);
        assert_eq!(optimizer_states(None).0, 2);
        assert_eq!(optimizer_states(Some("SGD")).0, 1);
        assert_eq!(optimizer_states(Some("Lion")).0, 1);
    }
}
