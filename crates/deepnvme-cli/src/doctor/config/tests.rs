use super::*;
use serde_json::json;

fn cfg(v: Value) -> DsConfig {
    DsConfig::from_value(Path::new("ds.json"), &v)
}

#[test]
fn defaults_are_deepspeeds() {
    let c =
        cfg(json!({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}}));
    assert!(!c.aio_given);
    assert_eq!(c.aio, Aio::default());
    assert_eq!((c.aio.queue_depth, c.aio.overlap_events), (8, true));
    let p = c.param.as_ref().unwrap();
    assert_eq!((p.buffer_count, p.buffer_size, p.pin_memory), (5, 100_000_000, true));
    assert!(c.optimizer.is_none());
    assert_eq!(c.paths(), vec![(PathBuf::from("/nvme"), vec!["zero_optimization.offload_param.nvme_path".into()])]);
    assert_eq!((c.model_dtype_bytes, c.sub_group_size), (4, 1_000_000_000));
    assert!(c.notes.is_empty(), "{:?}", c.notes);
}

#[test]
fn locked_bytes_follow_deepspeeds_swappers() {
    let c = cfg(json!({
        "bf16": {"enabled": true},
        "zero_optimization": {"stage": 3, "sub_group_size": 1e6,
            "offload_param": {"device": "nvme", "nvme_path": "/n", "buffer_count": 3, "buffer_size": 1e6},
            "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "buffer_count": 4}},
        "aio": {"intra_op_parallelism": 2, "queue_depth": 16}
    }));
    assert_eq!(c.model_dtype_bytes, 2);
    // 2048-byte alignment: 1024 bf16 elements; 1e6 rounds up to 1000448.
    assert_eq!(c.aligned_numel(1_000_000, 2), 1_000_448);
    let none = Model { params: None, largest: None, world_size: 1, nodes: 1 };
    let l = c.locked(&none, 4096);
    assert_eq!(l.parts.len(), 3);
    assert_eq!(l.parts[0].bytes, (3 * 1_000_448 * 2u64).div_ceil(4096) * 4096);
    assert!(l.parts[0].exact && !l.parts[1].exact && !l.parts[2].exact);
    // fp32: 512-element alignment; 1e6 rounds up to 1000448 too.
    assert_eq!(l.parts[2].bytes, 4 * (1_000_448u64 * 4).div_ceil(4096) * 4096);
    assert_eq!(l.exact(), l.parts[0].bytes);
    // A small model bounds the sub-group below sub_group_size.
    let m = Model { params: Some(10_000), largest: None, world_size: 2, nodes: 1 };
    let small = c.locked(&m, 4096);
    // The rank's partition is 5000 elements, padded to 5120 fp32: 20 KiB each.
    assert_eq!(small.parts[2].bytes, 4 * 20480);
    // The swap-out buffer holds the whole model here (10000 < 2 x 1e6), padded to 10240 bf16.
    assert_eq!(small.parts[1].bytes, 20480);
    assert_eq!(c.handles(), 3);
    // GDS puts the parameter buffers on the GPU.
    let g = cfg(json!({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/n"}},
                       "aio": {"use_gds": true}}));
    assert!(g.locked(&none, 4096).parts.iter().all(|p| !p.exact));
}

#[test]
fn swap_files_use_adams_sixteen_bytes() {
    let c = cfg(json!({"fp16": {"enabled": true}, "zero_optimization": {"stage": 3,
        "offload_param": {"device": "nvme", "nvme_path": "/n"},
        "offload_optimizer": {"device": "nvme", "nvme_path": "/n"}}}));
    let m = Model { params: Some(1000), largest: None, world_size: 1, nodes: 1 };
    assert_eq!(c.swap_files(&m, None).unwrap().total(), 1000 * 2 + 1000 * 16);
    let opt = c.swap_files(&m, Some("zero_optimization.offload_optimizer")).unwrap();
    assert_eq!(opt.total(), 1000 * 16);
    // Two nodes: each holds half.
    assert_eq!(c.swap_files(&Model { nodes: 2, ..m }, None).unwrap().total(), 500 * 18);
    assert!(c.swap_files(&Model { params: None, ..m }, None).is_none());
}

#[test]
fn values_are_read_as_deepspeed_reads_them() {
    let c = cfg(json!({"zero_optimization": {"stage": "3", "stage3_max_reuse_distance": 1e6,
        "offload_param": {"device": "nvme", "nvme_path": "", "buffer_count": "8", "pin_memory": "no"},
        "offload_optimizer": {"device": "NVMe", "nvme_path": "/o", "buffer_count": "auto", "pipeline_read": "yes"}},
        "aio": {"queue_depth": "8", "block_size": 4096, "single_submit": 1}}));
    assert_eq!(c.stage, Some(3));
    let p = c.param.as_ref().unwrap();
    assert_eq!((p.buffer_count, p.pin_memory, p.nvme_path.as_deref()), (8, false, Some(Path::new("."))));
    // Refused by DeepSpeed (the config section says so), still the folder to check.
    let o = c.optimizer.as_ref().unwrap();
    assert_eq!((o.buffer_count, o.pipeline()), (4, true));
    assert_eq!(c.max_reuse_distance, 1_000_000);
    // aio_handle refuses the string: the default is what a fixed config gets.
    assert_eq!((c.aio.queue_depth, c.aio.block_size, c.aio.single_submit), (8, 4096, true));
    assert_eq!(c.paths().len(), 2);
}

#[test]
fn notes_name_what_deepspeed_ignores() {
    let c = cfg(
        json!({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "buffer_count": "auto"}},
                       "aio": {"thread_count": 4}}),
    );
    let notes = c.notes.join("\n");
    assert!(notes.contains("thread_count is ignored"), "{notes}");
    assert!(notes.contains("only with ZeRO stage 3"), "{notes}");
    assert_eq!(c.optimizer.as_ref().unwrap().buffer_count, 4);
    assert_eq!(c.aio.intra_op_parallelism, 1);
    // "cpu" offload swaps nothing.
    let cpu = cfg(json!({"zero_optimization": {"offload_param": {"device": "cpu"}}}));
    assert!(!cpu.swaps());
}

#[test]
fn the_checkpoint_writer_as_deepspeed_reads_it() {
    let writer = |w: Value| cfg(json!({"checkpoint": {"writer": w}}));
    assert!(writer(json!({})).fast_writer());
    assert!(writer(json!({"type": "Fast"})).fast_writer());
    assert!(!writer(json!({"type": "python"})).fast_writer());
    assert!(!writer(json!({"type": null})).fast_writer());
    assert!(!writer(json!(null)).fast_writer());
    assert!(!cfg(json!({})).fast_writer());
    assert_eq!(writer(json!({})).aio_handle_users().len(), 1);
}
