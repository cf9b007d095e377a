//! Two ranks in one process (one thread each) over a real Gloo group on loopback.

use std::time::Duration;

use ptrain_core::{
    config::{Config, ShardMode},
    dist::{Collectives, DataParallel},
    optim::{Optimizer, ShardSpec, Sharded},
};
use tch::{Device, Kind, Tensor};

use crate::{C10dDataParallel, Group, GroupSpec};

/// A port no other test takes while this process runs (never one bound to port 0
/// and released before the group binds it).
fn free_port() -> u16 {
    ptrain_test_ports::reserve()
}

/// Runs `body(rank, dp)` on two ranks and returns what each returned.
fn on_two_ranks<T: Send>(bucket_mb: f64, body: impl Fn(u32, &mut C10dDataParallel) -> T + Sync) -> Vec<T> {
    let port = free_port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let body = &body;
                s.spawn(move || {
                    let spec = GroupSpec::local_gloo(port, rank, 2, Duration::from_secs(20));
                    let mut dp = C10dDataParallel::new(Group::connect(spec).expect("group"), bucket_mb);
                    body(rank, &mut dp)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::try_from(t.flatten(0, -1)).expect("f32 values")
}

#[test]
fn gradients_are_averaged_across_buckets_and_the_inf_flag_is_shared() {
    // A 1e-5 MB cap (10 bytes) puts each of the three gradients in its own bucket.
    let out = on_two_ranks(1e-5, |rank, dp| {
        let r = rank as f64;
        let grads = [
            Tensor::full([2, 3], 1.0 + r, (Kind::Float, Device::Cpu)),
            Tensor::arange(4, (Kind::Float, Device::Cpu)) * (1.0 + 2.0 * r),
            Tensor::full([5], 10.0 * r, (Kind::Float, Device::Cpu)),
        ];
        let found_inf = Tensor::from(r as f32);
        dp.all_reduce_grads(&grads, &found_inf).expect("all-reduce");
        let first = (grads.iter().map(values).collect::<Vec<_>>(), found_inf.double_value(&[]));
        // A second step reuses the buckets; nobody saw inf this time.
        for g in &grads {
            let _ = g.shallow_clone().fill_(r + 1.0);
        }
        let _ = found_inf.shallow_clone().fill_(0.0);
        dp.all_reduce_grads(&grads, &found_inf).expect("all-reduce");
        (first, values(&grads[2]), found_inf.double_value(&[]))
    });
    for (rank, ((grads, inf), second, inf2)) in out.into_iter().enumerate() {
        assert_eq!(grads[0], vec![1.5; 6], "rank {rank}");
        assert_eq!(grads[1], vec![0.0, 2.0, 4.0, 6.0], "rank {rank}");
        assert_eq!(grads[2], vec![5.0; 5], "rank {rank}");
        assert_eq!(inf, 1.0, "rank {rank}: rank 1's non-finite loss must skip the step everywhere");
        assert_eq!(second, vec![1.5; 5], "rank {rank}");
        assert_eq!(inf2, 0.0, "rank {rank}");
    }
}

#[test]
fn collectives_work_on_views_and_broadcast_from_any_root() {
    let out = on_two_ranks(25.0, |rank, dp| {
        let group = dp.group();
        // A transposed (non-contiguous) view is reduced through a staging copy.
        let base = Tensor::arange(6, (Kind::Double, Device::Cpu)).view([2, 3]) + rank as f64;
        let mut view = base.tr();
        group.all_reduce_sum(&mut view).expect("all-reduce");
        let mut b = Tensor::from_slice(&[rank as f64 + 7.0]);
        group.broadcast(&mut b, 1).expect("broadcast");
        (Vec::<f64>::try_from(base.flatten(0, -1)).unwrap(), b.double_value(&[0]), group.broadcast(&mut b, 2).is_err())
    });
    for (rank, (reduced, broadcast, bad_root)) in out.into_iter().enumerate() {
        assert_eq!(reduced, vec![1.0, 3.0, 5.0, 7.0, 9.0, 11.0], "rank {rank}");
        assert_eq!(broadcast, 8.0, "rank {rank}");
        assert!(bad_root, "rank {rank}");
    }
}

#[test]
fn parameters_start_from_rank_zeros_values() {
    let out = on_two_ranks(25.0, |rank, dp| {
        let params = [Tensor::full([3, 2], rank as f64 + 1.0, (Kind::Float, Device::Cpu)), Tensor::from_slice(&[rank as i64 * 5])];
        dp.broadcast_params(&params).expect("broadcast");
        (values(&params[0]), params[1].int64_value(&[0]), dp.collective_secs())
    });
    for (rank, (first, second, secs)) in out.into_iter().enumerate() {
        assert_eq!(first, vec![1.0; 6], "rank {rank}");
        assert_eq!(second, 0, "rank {rank}");
        assert!(secs > 0.0, "rank {rank}: time in collectives is counted");
    }
}

/// A rank's view after a sharded step: owned averaged gradient, the global
/// gradient norm, the flag, a parameter after the all-gather.
type StepView = (Vec<f32>, f64, f64, Vec<f32>);

/// One sharded step's collectives on two ranks: parameters of 6 + 4 + 5 = 15
/// elements (slices [0, 8) and [8, 15), buffers padded to 16), rank r's flat
/// gradient `(r + 1) * i`, rank 1 reporting a non-finite loss.
fn sharded_step(mode: ShardMode, reduce_scatter: bool, bucket_mb: f64) -> Vec<StepView> {
    on_two_ranks(bucket_mb, |rank, dp| {
        let params: Vec<(String, Tensor)> = [vec![2i64, 3], vec![4], vec![5]]
            .iter()
            .enumerate()
            .map(|(i, shape)| (format!("p{i}"), Tensor::zeros(shape.as_slice(), (Kind::Float, Device::Cpu)).set_requires_grad(true)))
            .collect();
        let spec = ShardSpec { mode, rank, world: 2, save_id: 1, launch_secs: 0 };
        let mut config = Config::default().optim;
        config.grad_clip = 0.0;
        let mut optimizer = Sharded::new(&config, &params, spec).expect("sharded optimizer");
        optimizer.zero_grad().expect("zero_grad");
        // The parameters' `.grad` are views of one flat gradient: fill it through them.
        for (i, (_, p)) in params.iter().enumerate() {
            let start = [0i64, 6, 10][i];
            let g = Tensor::arange_start(start, start + p.numel() as i64, (Kind::Float, Device::Cpu)) * (rank as f64 + 1.0);
            p.grad().copy_(&g.view(p.size().as_slice()));
        }
        let found_inf = Tensor::from(rank as f32);
        dp.set_reduce_scatter(reduce_scatter);
        optimizer.reduce_gradients(dp, &found_inf).expect("reduce");
        let owned = values(optimizer.owned_grads());
        let norm = optimizer.clip_grad_norm().expect("norm").double_value(&[]);
        let _ = optimizer.flat_params().narrow(0, rank as i64 * 8, 8).fill_(rank as f64 + 1.0);
        optimizer.sync_params(dp).expect("all-gather");
        (owned, norm, found_inf.double_value(&[]), values(&params[2].1))
    })
}

#[test]
fn sharded_gradients_reduce_to_each_ranks_slice_by_every_path() {
    let mean = |range: std::ops::Range<i32>| range.map(|i| 1.5 * i as f32).collect::<Vec<_>>();
    let norm = (0..15).map(|i| (1.5 * i as f64).powi(2)).sum::<f64>().sqrt();
    // Buckets of 2 elements (1 per rank's slice), and one bucket for everything.
    for (mode, reduce_scatter, bucket_mb) in [
        (ShardMode::Gradients, true, 8e-6),
        (ShardMode::Gradients, true, 25.0),
        (ShardMode::Gradients, false, 8e-6),
        (ShardMode::Optimizer, false, 8e-6),
    ] {
        let out = sharded_step(mode, reduce_scatter, bucket_mb);
        for (rank, (owned, global_norm, flag, p2)) in out.into_iter().enumerate() {
            let case = format!("{mode:?}, reduce-scatter {reduce_scatter}, {bucket_mb} MB, rank {rank}");
            assert_eq!(owned, if rank == 0 { mean(0..8) } else { mean(8..15) }, "{case}");
            assert!((global_norm - norm).abs() <= 1e-4 * norm, "{case}: the global norm {global_norm}, not {norm}");
            assert_eq!(flag, 1.0, "{case}: rank 1's non-finite loss must skip the step everywhere");
            // p2 is flat [10, 15): rank 0's slice ends at 8, so all of it is rank 1's.
            assert_eq!(p2, vec![2.0; 5], "{case}");
        }
    }
}

/// Parameter sharding's reduce-scatter, by NCCL's path (c10d's reduce-scatter, in
/// place: the output is the rank's chunk of the flat gradient) and Gloo's (all-reduce,
/// keep the chunk): each rank's chunk becomes the average. An output anywhere else in
/// the flat gradient is refused before any collective, on both paths: NCCL would give
/// undefined results there, and Gloo's paths the right ones, so only the check makes
/// the CPU tests see a wrong offset.
#[test]
fn parameter_shards_reduce_scatter_in_place_into_each_ranks_chunk_only() {
    for reduce_scatter in [true, false] {
        let out = on_two_ranks(25.0, |rank, dp| {
            dp.set_reduce_scatter(reduce_scatter);
            let comm = dp.shard_collectives().expect("shard collectives");
            let flat = Tensor::arange(16, (Kind::Float, Device::Cpu)) * (rank as f64 + 1.0);
            let own = flat.narrow(0, rank as i64 * 8, 8);
            comm.reduce_scatter(&flat, &own).expect("reduce-scatter");
            let other = flat.narrow(0, (1 - rank as i64) * 8, 8);
            let refused = comm.reduce_scatter(&flat, &other).expect_err("the other rank's chunk is refused");
            let short = comm.reduce_scatter(&flat, &flat.narrow(0, rank as i64 * 8, 4)).expect_err("a partial chunk is refused");
            (values(&own), refused, short)
        });
        for (rank, (own, refused, short)) in out.into_iter().enumerate() {
            let want: Vec<f32> = (rank * 8..rank * 8 + 8).map(|i| 1.5 * i as f32).collect();
            assert_eq!(own, want, "reduce-scatter {reduce_scatter}, rank {rank}");
            assert!(refused.contains(&format!("rank {rank}'s chunk")), "{refused}");
            assert!(short.contains("not 4 elements"), "{short}");
        }
    }
}

#[test]
fn bytes_of_any_length_gather_on_every_rank_in_rank_order() {
    let out = on_two_ranks(25.0, |rank, dp| {
        // Rank 1's bytes are longer than rank 0's, and hold zeros (the padding's value).
        let mine: Vec<u8> = match rank {
            0 => b"rank 0".to_vec(),
            _ => (0..1000u32).map(|i| (i % 256) as u8).collect(),
        };
        let gathered = ptrain_core::dist::all_gather_bytes(dp.group(), rank, 2, &mine, Device::Cpu).expect("gather");
        // Then one rank with nothing, and then both.
        let one_empty = ptrain_core::dist::all_gather_bytes(dp.group(), rank, 2, if rank == 0 { b"" } else { b"x" }, Device::Cpu).expect("gather");
        let both_empty = ptrain_core::dist::all_gather_bytes(dp.group(), rank, 2, b"", Device::Cpu).expect("gather");
        (gathered, one_empty, both_empty)
    });
    let rank_1: Vec<u8> = (0..1000u32).map(|i| (i % 256) as u8).collect();
    for (rank, (gathered, one_empty, both_empty)) in out.into_iter().enumerate() {
        assert_eq!(gathered, [b"rank 0".to_vec(), rank_1.clone()], "rank {rank}");
        assert_eq!(one_empty, [b"".to_vec(), b"x".to_vec()], "rank {rank}");
        assert_eq!(both_empty, [Vec::<u8>::new(), Vec::new()], "rank {rank}");
    }
}
