//! Cost of one bucketed gradient all-reduce between two ranks (two threads, Gloo on
//! loopback), apart from any training: copies in, all-reduce, scaled copies out.
//!
//!   cargo run --release -p ptrain-dist --example allreduce -- [elements=118528] [tensors=26] [iters=500] [bucket_mb=25]
//!
//! The defaults are the tiny GPT's (configs/tiny-gpt.toml) gradient: 118,528 floats in 26 tensors.

use std::{
    net::TcpListener,
    time::{Duration, Instant},
};

use ptrain_core::dist::DataParallel;
use ptrain_dist::{C10dDataParallel, Group, GroupSpec};
use tch::{Device, Kind, Tensor};

fn main() {
    let arg = |i: usize, default: f64| std::env::args().nth(i).map_or(default, |a| a.parse().expect("a number"));
    let (elements, tensors, iters, bucket_mb) = (arg(1, 118_528.0) as i64, arg(2, 26.0) as i64, arg(3, 500.0) as usize, arg(4, 25.0));
    tch::set_num_threads(1);
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let times: Vec<Vec<f64>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2u32)
            .map(|rank| {
                s.spawn(move || {
                    let spec = GroupSpec::local_gloo(port, rank, 2, Duration::from_secs(30));
                    let mut dp = C10dDataParallel::new(Group::connect(spec).unwrap(), bucket_mb);
                    let grads: Vec<Tensor> = (0..tensors).map(|_| Tensor::randn([elements / tensors], (Kind::Float, Device::Cpu))).collect();
                    let found_inf = Tensor::zeros([], (Kind::Float, Device::Cpu));
                    let mut out = Vec::with_capacity(iters);
                    for i in 0..iters + 20 {
                        let t = Instant::now();
                        dp.all_reduce_grads(&grads, &found_inf).unwrap();
                        if i >= 20 {
                            out.push(t.elapsed().as_secs_f64() * 1e6);
                        }
                    }
                    out
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut t = times[0].clone();
    t.sort_by(f64::total_cmp);
    let bytes = elements * 4;
    println!(
        "{elements} floats ({:.2} MB) in {tensors} tensors, bucket_mb {bucket_mb}: median {:.0} us, p10 {:.0} us, p90 {:.0} us per all-reduce ({iters} iterations)",
        bytes as f64 / 1e6,
        t[t.len() / 2],
        t[t.len() / 10],
        t[t.len() * 9 / 10]
    );
}
