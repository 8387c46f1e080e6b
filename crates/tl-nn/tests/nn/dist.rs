//! Data-parallel training without MPI: [`Local`] (one rank) steps bit for bit as no group, and
//! a test-only engine of threads in this process (`Threads`, each rank a thread with its own
//! runtime) checks the arithmetic of N ranks against one process, planted bugs included. The
//! same checks under `mpirun` with the MPI engine: `.ci/dist-check`.

use std::sync::{Arc, Barrier, Mutex};

use tl_nn::data::{Classify, DataLoader, digits};
use tl_nn::dist::{Collective, Local};
use tl_nn::{Activation, CLASSES, Linear, Module, PIXELS, Runtime, Sequential};
use tl_session::{Backend, Optimizer, Train};

use crate::{eager, linked, linked_on};

/// Ranks as threads of this process, meeting at a barrier around shared slots; sums are taken
/// in rank order, once, so every rank gets the same bits. Test-only: the project's engine for
/// processes is MPI.
struct Threads {
    rank: usize,
    size: usize,
    barrier: Arc<Barrier>,
    slots: Arc<Mutex<Vec<Vec<u8>>>>,
    /// A planted bug: `Some(k)` leaves the k-th all-reduce of each step's buckets undone.
    skip: Option<usize>,
    /// A planted bug: the all-reduce returns the mean instead of the sum.
    mean_instead_of_sum: bool,
    reduces: std::cell::Cell<usize>,
}

fn group(size: usize) -> Vec<Threads> {
    let barrier = Arc::new(Barrier::new(size));
    let slots = Arc::new(Mutex::new(vec![Vec::new(); size]));
    (0..size)
        .map(|rank| Threads {
            rank,
            size,
            barrier: barrier.clone(),
            slots: slots.clone(),
            skip: None,
            mean_instead_of_sum: false,
            reduces: std::cell::Cell::new(0),
        })
        .collect()
}

impl Threads {
    /// Every rank's bytes, after every rank has put its own.
    fn exchange(&self, mine: Vec<u8>) -> Vec<Vec<u8>> {
        self.slots.lock().unwrap()[self.rank] = mine;
        self.barrier.wait();
        let all = self.slots.lock().unwrap().clone();
        self.barrier.wait();
        all
    }

    fn sum<const N: usize, T: Copy + std::ops::AddAssign + std::ops::DivAssign>(
        &self,
        buf: &mut [T],
        to: fn(T) -> [u8; N],
        from: fn([u8; N]) -> T,
        n: T,
    ) {
        let call = self.reduces.get();
        self.reduces.set(call + 1);
        let all = self.exchange(buf.iter().flat_map(|&x| to(x)).collect());
        if self.skip == Some(call) {
            return;
        }
        for (i, x) in buf.iter_mut().enumerate() {
            let mut s = from(all[0][i * N..(i + 1) * N].try_into().unwrap());
            for r in &all[1..] {
                s += from(r[i * N..(i + 1) * N].try_into().unwrap());
            }
            if self.mean_instead_of_sum {
                s /= n;
            }
            *x = s;
        }
    }
}

impl Collective for Threads {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> tl_nn::Result<()> {
        self.sum(buf, f32::to_le_bytes, f32::from_le_bytes, self.size as f32);
        Ok(())
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> tl_nn::Result<()> {
        self.sum(buf, f64::to_le_bytes, f64::from_le_bytes, self.size as f64);
        Ok(())
    }
    fn broadcast_f32(&self, buf: &mut [f32]) -> tl_nn::Result<()> {
        let all = self.exchange(buf.iter().flat_map(|x| x.to_le_bytes()).collect());
        for (i, x) in buf.iter_mut().enumerate() {
            *x = f32::from_le_bytes(all[0][i * 4..i * 4 + 4].try_into().unwrap());
        }
        Ok(())
    }
    fn broadcast_f64(&self, buf: &mut [f64]) -> tl_nn::Result<()> {
        let all = self.exchange(buf.iter().flat_map(|x| x.to_le_bytes()).collect());
        for (i, x) in buf.iter_mut().enumerate() {
            *x = f64::from_le_bytes(all[0][i * 8..i * 8 + 8].try_into().unwrap());
        }
        Ok(())
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> tl_nn::Result<Vec<Vec<u8>>> {
        // A new step's gathers come before its buckets.
        self.reduces.set(0);
        Ok(self.exchange(mine.to_vec()))
    }
}

/// The digits MLP (hidden 16) from seed 3.
fn mlp<O: Train>(rt: &Runtime<O>) -> Sequential<O> {
    let v = rt.vars();
    Sequential::new()
        .add(Linear::new(&v.pp(0), PIXELS, 16).unwrap())
        .add(Activation::Relu)
        .add(Linear::new(&v.pp(2), 16, CLASSES).unwrap())
}

fn values<O: Train, M: tl_nn::Parameters>(rt: &Runtime<O>, m: &M) -> Vec<f64> {
    rt.state_dict(m)
        .unwrap()
        .into_iter()
        .flat_map(|(_, t)| t.data().iter().map(|x| x.as_f64()).collect::<Vec<_>>())
        .collect()
}

use tl_spec::Scalar;

fn optimizer(clip: bool) -> Optimizer {
    let opt = Optimizer::sgd(0.1).unwrap();
    if clip {
        // A norm below the gradients': the clip changes every step, so it must see the mean.
        opt.clip_grad_norm(0.05, 2.0).unwrap()
    } else {
        opt
    }
}

/// `steps` steps of the MLP on rank `rank` of `comm` (or alone when `None`), global batch
/// `batch`, bucket `bucket`: the parameters after.
fn train<O: Train>(
    rt: Runtime<O>,
    comm: Option<Box<dyn Collective>>,
    batch: usize,
    steps: usize,
    bucket: usize,
    clip: bool,
) -> Vec<f64> {
    train_traffic(rt, comm, batch, steps, bucket, clip).0
}

/// [`train`] (batch 32, 4 steps) on a fresh runtime of `make` alone, then on another in the
/// group `comm` makes: the two parameter lists.
fn alone_and_in<O: Train>(
    make: impl Fn() -> Runtime<O>,
    comm: impl Fn() -> Box<dyn Collective>,
    bucket: usize,
    clip: bool,
) -> (Vec<f64>, Vec<f64>) {
    let alone = train(make(), None, 32, 4, bucket, clip);
    (alone, train(make(), Some(comm()), 32, 4, bucket, clip))
}

/// [`train`], with the session's device traffic of the last step (`None` on the CPU).
fn train_traffic<O: Train>(
    mut rt: Runtime<O>,
    comm: Option<Box<dyn Collective>>,
    batch: usize,
    steps: usize,
    bucket: usize,
    clip: bool,
) -> (Vec<f64>, Option<tl_tape_cuda::Traffic>) {
    let (train, _) = digits().unwrap();
    let model = mlp(&rt);
    let mut loader = DataLoader::new(&train, batch, Classify { classes: CLASSES })
        .unwrap()
        .shuffle(5);
    if let Some(comm) = comm {
        let (rank, size) = (comm.rank(), comm.size());
        rt.data_parallel(&model, comm).unwrap();
        rt.set_bucket_elems(bucket).unwrap();
        loader = loader.shard(rank, size).unwrap();
    }
    let mut opt = optimizer(clip);
    let mut last = None;
    for (x, labels) in loader.epoch(0).take(steps).map(Result::unwrap) {
        let x = x.cast::<O::T>();
        let before = rt.session().traffic();
        rt.step(&model, &mut opt, |g| {
            model.forward(&g.input(x)?)?.cross_entropy(&labels)
        })
        .unwrap();
        last = rt.session().traffic().zip(before).map(|(a, b)| a - b);
    }
    (values(&rt, &model), last)
}

/// Every rank's parameters after `steps` steps, each rank a thread of `make`'s runtime.
fn ranks<O: Train + 'static>(
    make: fn() -> Runtime<O>,
    comms: Vec<Threads>,
    batch: usize,
    steps: usize,
    bucket: usize,
    clip: bool,
) -> Vec<Vec<f64>> {
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || train(make(), Some(Box::new(c)), batch, steps, bucket, clip))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn worst(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn eager_f32() -> Runtime<tl_session::Session<f32>> {
    eager::<f32>(Backend::Cpu, 0)
}

fn linked_f64() -> Runtime<tl_session::LinkedSession<f64>> {
    linked::<f64>(0)
}

/// The eager session on the simulation device: the gradients on a device, reduced through the
/// host.
fn eager_sim_f32() -> Runtime<tl_session::Session<f32>> {
    eager::<f32>(Backend::CudaSim, 0)
}

/// The linked session on the simulation device (its steps run on the device's tape).
fn linked_sim_f32() -> Runtime<tl_session::LinkedSession<f32>> {
    linked_on(Backend::CudaSim, 0)
}

#[test]
fn a_group_of_one_steps_bit_for_bit_as_no_group() {
    for bucket in [7, tl_nn::dist::DEFAULT_BUCKET_ELEMS] {
        let local = || Box::new(Local) as Box<dyn Collective>;
        let (alone, group) = alone_and_in(eager_f32, local, bucket, true);
        assert_eq!(alone, group, "bucket {bucket}");
        let (alone, group) = alone_and_in(linked_f64, local, bucket, false);
        assert_eq!(alone, group, "linked, bucket {bucket}");
        let (alone, group) = alone_and_in(eager_sim_f32, local, bucket, true);
        assert_eq!(alone, group, "eager on the sim, bucket {bucket}");
        let (alone, group) = alone_and_in(linked_sim_f32, local, bucket, true);
        assert_eq!(alone, group, "linked on the sim, bucket {bucket}");
    }
}

/// On the simulation device a host engine's step takes the gradients down to the host and
/// back: N ranks take one rank's steps, for the eager session and the linked one (whose step
/// runs on its compiled device tape), and a planted wrong mean shows there too.
#[test]
fn n_ranks_on_a_device_take_the_steps_of_one_rank() {
    fn check<O: Train + 'static>(what: &str, make: fn() -> Runtime<O>) {
        let one = train(make(), None, 64, 6, 100, true);
        let all = ranks(make, group(2), 64, 6, 100, true);
        assert_eq!(all[0], all[1], "{what}");
        let d = worst(&all[0], &one);
        assert!(d < 1e-5, "{what}: 2 ranks on the sim vs one: {d:e}");
        // Without clipping (a clip to a norm below the gradients' hides a halved mean).
        let one = train(make(), None, 64, 6, 100, false);
        let mut wrong = group(2);
        wrong.iter_mut().for_each(|c| c.mean_instead_of_sum = true);
        let all = ranks(make, wrong, 64, 6, 100, false);
        assert!(
            worst(&all[0], &one) > 1e-3,
            "{what}: the wrong mean went unnoticed"
        );
    }
    check("eager", eager_sim_f32);
    check("linked", linked_sim_f32);
}

#[test]
fn n_ranks_with_batch_b_over_n_take_the_steps_of_one_rank_with_batch_b() {
    // Eager f32 (small buckets: parameters split across all-reduces), clipping on, 2 and 4 ranks.
    for (n, bucket) in [(2, 100), (4, 7)] {
        let one = train(eager_f32(), None, 64, 6, bucket, true);
        let all = ranks(eager_f32, group(n), 64, 6, bucket, true);
        for (r, p) in all.iter().enumerate() {
            assert_eq!(p, &all[0], "{n} ranks: rank {r} differs from rank 0");
        }
        let d = worst(&all[0], &one);
        assert!(d < 1e-5, "{n} ranks vs one: {d:e}");
    }
    // The linked session (f64: tight tolerance).
    let one = train(linked_f64(), None, 64, 6, 50, false);
    let all = ranks(linked_f64, group(2), 64, 6, 50, false);
    assert_eq!(all[0], all[1]);
    let d = worst(&all[0], &one);
    assert!(d < 1e-12, "linked: {d:e}");
}

#[test]
fn a_planted_wrong_mean_or_skipped_bucket_fails_the_check() {
    let one = train(eager_f32(), None, 64, 6, 100, false);
    let mut wrong = group(2);
    wrong.iter_mut().for_each(|c| c.mean_instead_of_sum = true);
    let all = ranks(eager_f32, wrong, 64, 6, 100, false);
    assert_eq!(
        all[0], all[1],
        "a wrong mean is the same wrong mean on every rank"
    );
    assert!(worst(&all[0], &one) > 1e-3, "the wrong mean went unnoticed");
    let mut skip = group(2);
    skip.iter_mut().for_each(|c| c.skip = Some(1));
    let all = ranks(eager_f32, skip, 64, 6, 100, false);
    assert_ne!(all[0], all[1], "a skipped bucket leaves the ranks apart");
}

#[test]
fn a_rank_that_fails_stops_every_rank_with_its_error() {
    let handles: Vec<_> = group(2)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rank = c.rank;
                let mut rt = eager_f32();
                let model = mlp(&rt);
                rt.data_parallel(&model, Box::new(c)).unwrap();
                let mut opt = optimizer(false);
                let width = if rank == 1 { PIXELS - 1 } else { PIXELS };
                let x = tl_spec::Tensor::<f32>::zeros(vec![4, width]);
                let labels = tl_nn::Labels::new(vec![0, 1, 2, 3], CLASSES).unwrap();
                let before = values(&rt, &model);
                let e = rt
                    .step(&model, &mut opt, |g| {
                        model.forward(&g.input(x)?)?.cross_entropy(&labels)
                    })
                    .unwrap_err()
                    .to_string();
                assert_eq!(values(&rt, &model), before, "rank {rank} stepped");
                e
            })
        })
        .collect();
    let errors: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(errors[1].contains("63 features"), "{}", errors[1]);
    assert!(
        errors[0].contains("rank 1 failed") && errors[0].contains("63 features"),
        "{}",
        errors[0]
    );
}

#[test]
fn ranks_whose_models_differ_are_an_error_naming_the_parameter() {
    let handles: Vec<_> = group(2)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rt0 = eager_f32();
                let v = rt0.vars();
                let hidden = if c.rank == 1 { 17 } else { 16 };
                let model: Sequential<tl_session::Session<f32>> = Sequential::new()
                    .add(Linear::new(&v.pp(0), PIXELS, 16).unwrap())
                    .add(Activation::Relu)
                    .add(Linear::new(&v.pp(2), 16, hidden).unwrap());
                let mut rt = rt0;
                rt.data_parallel(&model, Box::new(c))
                    .unwrap_err()
                    .to_string()
            })
        })
        .collect();
    for h in handles {
        let e = h.join().unwrap();
        assert!(
            e.contains("parameter 2")
                && e.contains("\"2.weight\" of shape [16, 16]")
                && e.contains("[17, 16]"),
            "{e}"
        );
    }
}

#[test]
fn shards_are_disjoint_parts_of_the_global_batches() {
    let data: Vec<usize> = (0..103).collect();
    let collate = |v: Vec<usize>| -> tl_nn::Result<Vec<usize>> { Ok(v) };
    let whole = DataLoader::new(&data[..], 8, collate)
        .unwrap()
        .shuffle(2)
        .drop_last(true);
    let parts: Vec<_> = (0..4)
        .map(|r| {
            DataLoader::new(&data[..], 8, collate)
                .unwrap()
                .shuffle(2)
                .shard(r, 4)
                .unwrap()
        })
        .collect();
    for epoch in 0..2 {
        let global: Vec<Vec<usize>> = whole.epoch(epoch).map(Result::unwrap).collect();
        let mine: Vec<Vec<Vec<usize>>> = parts
            .iter()
            .map(|p| p.epoch(epoch).map(Result::unwrap).collect())
            .collect();
        assert_eq!(global.len(), 103 / 8);
        for (b, g) in global.iter().enumerate() {
            let joined: Vec<usize> = (0..4).flat_map(|r| mine[r][b].clone()).collect();
            assert_eq!(&joined, g, "epoch {epoch}, batch {b}");
        }
        // Every example at most once per epoch (the 103 % 8 left over are left out).
        let mut seen: Vec<usize> = mine.iter().flatten().flatten().copied().collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 96);
    }
    for (rank, ranks, batch) in [(0, 0, 8), (4, 4, 8), (0, 3, 8)] {
        let e = match DataLoader::new(&data[..], batch, collate)
            .unwrap()
            .shard(rank, ranks)
        {
            Ok(_) => panic!("rank {rank} of {ranks}, batch {batch}: no error"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("DataLoader::shard")
                && e.contains(&format!(
                    "rank {rank} of {ranks} ranks and batch size {batch}"
                )),
            "{e}"
        );
    }
}

#[test]
fn group_calls_outside_a_group_and_twice_are_errors() {
    let mut rt = eager_f32();
    let model = mlp(&rt);
    assert_eq!((rt.rank(), rt.world_size()), (0, 1));
    assert!(rt.collective().is_none());
    let e = rt.set_bucket_elems(10).unwrap_err().to_string();
    assert!(e.contains("not in a data-parallel group"), "{e}");
    rt.data_parallel(&model, Box::new(Local)).unwrap();
    let e = rt.set_bucket_elems(0).unwrap_err().to_string();
    assert!(e.contains("at least 1, got 0"), "{e}");
    let e = rt
        .data_parallel(&model, Box::new(Local))
        .unwrap_err()
        .to_string();
    assert!(e.contains("already"), "{e}");
    // A checkpoint in a group of one: written by rank 0, loaded back.
    let path = std::env::temp_dir().join(format!("tl-nn-dist-{}.safetensors", std::process::id()));
    rt.save(&model, &path).unwrap();
    rt.load(&model, &path).unwrap();
    std::fs::remove_file(&path).ok();
    let e = rt.load(&model, &path).unwrap_err().to_string();
    assert!(e.contains("No such file"), "{e}");
}

/// `data_parallel` after a step is refused (its docs: "before the first step"), naming the
/// steps taken, and makes no group; a step that failed took none, so the call after it is
/// accepted.
#[test]
fn data_parallel_after_a_step_is_refused() {
    let x = tl_spec::Tensor::<f32>::from_fn([2, PIXELS], |i| i as f32 * 1e-3);
    let labels = tl_nn::Labels::new(vec![0, 1], CLASSES).unwrap();
    let mut rt = eager_f32();
    let model = mlp(&rt);
    let mut opt = optimizer(false);
    // A failed step (the wrong width) takes no step.
    rt.step(&model, &mut opt, |g| {
        model
            .forward(&g.input(tl_spec::Tensor::zeros([2, 3]))?)?
            .cross_entropy(&labels)
    })
    .unwrap_err();
    let mut fresh = eager_f32();
    let fresh_model = mlp(&fresh);
    fresh
        .step(&fresh_model, &mut opt, |g| {
            fresh_model
                .forward(&g.input(tl_spec::Tensor::zeros([2, 3]))?)?
                .cross_entropy(&labels)
        })
        .unwrap_err();
    fresh.data_parallel(&fresh_model, Box::new(Local)).unwrap();
    // Two steps taken: refused, and the runtime stays out of a group.
    for _ in 0..2 {
        rt.step(&model, &mut opt, |g| {
            model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
        })
        .unwrap();
    }
    let e = rt
        .data_parallel(&model, Box::new(Local))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "Runtime::data_parallel: this runtime has taken 2 step(s) already: call data_parallel on every rank before the first step (it copies rank 0's parameters, not the optimizers' state, so ranks that stepped apart would stay apart)"
    );
    assert!(rt.collective().is_none());
    // Accumulated steps count too.
    let mut acc = eager_f32();
    let acc_model = mlp(&acc);
    acc.step_accumulated(&acc_model, &mut opt, 2, |g, _| {
        acc_model
            .forward(&g.input(x.clone())?)?
            .cross_entropy(&labels)
    })
    .unwrap();
    let e = acc
        .data_parallel(&acc_model, Box::new(Local))
        .unwrap_err()
        .to_string();
    assert!(e.contains("has taken 1 step(s) already"), "{e}");
}

/// The group is tied to the model `data_parallel` checked and broadcast: a step (plain or
/// accumulated) on a model with a parameter outside it is an error naming the parameter, on
/// every rank (rank 0, whose own step was fine, hears of rank 1's), and no rank updates; a
/// step on a part of the model is accepted.
#[test]
fn a_step_on_another_model_than_the_groups_is_refused() {
    let x = tl_spec::Tensor::<f32>::from_fn([2, 4], |i| i as f32 * 0.1);
    // One rank: another model, then a part of the group's.
    let mut rt = eager_f32();
    let body = Linear::new(&rt.vars().pp("body"), 4, 4).unwrap();
    let head = Linear::new(&rt.vars().pp("head"), 4, 4).unwrap();
    let model = Sequential::new().add(body.clone()).add(head.clone());
    let other = Linear::new(&rt.vars().pp("other"), 4, 4).unwrap();
    rt.data_parallel(&model, Box::new(Local)).unwrap();
    let mut opt = optimizer(false);
    let before = values(&rt, &other);
    let e = rt
        .step(&other, &mut opt, |g| {
            other.forward(&g.input(x.clone())?)?.sum()
        })
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        r#"Runtime::step: the step's model has parameter "other.weight" [4, 4], which is not in the model this data-parallel group was set up with (Runtime::data_parallel checked and broadcast that model's parameters only): step the model given to data_parallel, or a part of it"#
    );
    let e = rt
        .step_accumulated(&other, &mut opt, 2, |g, _| {
            other.forward(&g.input(x.clone())?)?.sum()
        })
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("Runtime::step_accumulated: the step's model has parameter \"other.weight\""),
        "{e}"
    );
    assert_eq!(values(&rt, &other), before, "a refused step updated");
    let before = values(&rt, &head);
    rt.step(&head, &mut opt, |g| {
        head.forward(&g.input(x.clone())?)?.sum()
    })
    .unwrap();
    assert_ne!(values(&rt, &head), before, "the head alone steps");
    rt.step(&model, &mut opt, |g| {
        model.forward(&g.input(x.clone())?)?.sum()
    })
    .unwrap();
    // Two ranks: rank 1 steps another model; every rank's step fails, none updates.
    let handles: Vec<_> = group(2)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rank = c.rank;
                let mut rt = eager_f32();
                let layer = Linear::new(&rt.vars().pp("fc"), 4, 4).unwrap();
                let other = Linear::new(&rt.vars().pp("other"), 4, 4).unwrap();
                rt.data_parallel(&layer, Box::new(c)).unwrap();
                let stepped = if rank == 1 { &other } else { &layer };
                let before = [values(&rt, &layer), values(&rt, &other)];
                let mut opt = optimizer(false);
                let x = tl_spec::Tensor::<f32>::from_fn([2, 4], |i| i as f32 * 0.1);
                let e = rt
                    .step(stepped, &mut opt, |g| stepped.forward(&g.input(x)?)?.sum())
                    .unwrap_err()
                    .to_string();
                assert_eq!(
                    [values(&rt, &layer), values(&rt, &other)],
                    before,
                    "rank {rank} stepped"
                );
                e
            })
        })
        .collect();
    let errors: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let own = "the step's model has parameter \"other.weight\" [4, 4], which is not in the model";
    assert!(
        errors[1].starts_with("Runtime::step: ") && errors[1].contains(own),
        "{}",
        errors[1]
    );
    assert!(
        errors[0].contains("rank 1 failed") && errors[0].contains(own),
        "{}",
        errors[0]
    );
}

/// What rank 1 changes in a two-rank group of a 4 → 4 linear layer, before `data_parallel`
/// (its runtime and optimizer) or after it (its runtime).
type Rank1Before = fn(&mut Runtime<tl_session::Session<f32>>, &mut Optimizer);
type Rank1After = fn(&mut Runtime<tl_session::Session<f32>>, &Linear);

/// Two ranks (threads) whose first step fails on both, rank 1 changed by `before` and
/// `after`: each rank's error, after checking that no rank updated.
fn first_steps_failing(before: Rank1Before, after: Rank1After) -> Vec<String> {
    let handles: Vec<_> = group(2)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rank = c.rank;
                let mut rt = eager_f32();
                let layer = Linear::new(&rt.vars().pp("fc"), 4, 4).unwrap();
                let mut opt = Optimizer::momentum(0.1, 0.9).unwrap();
                if rank == 1 {
                    before(&mut rt, &mut opt);
                }
                rt.data_parallel(&layer, Box::new(c)).unwrap();
                if rank == 1 {
                    after(&mut rt, &layer);
                }
                let before = values(&rt, &layer);
                let x = tl_spec::Tensor::<f32>::from_fn([2, 4], |i| i as f32 * 0.1);
                let e = rt
                    .step(&layer, &mut opt, |g| layer.forward(&g.input(x)?)?.sum())
                    .unwrap_err()
                    .to_string();
                assert_eq!(values(&rt, &layer), before);
                e
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn ranks_whose_steps_train_different_parameters_are_an_error() {
    // Rank 1 freezes the bias after the start-up check: its step has one gradient buffer
    // where rank 0's has two.
    let errors = first_steps_failing(
        |_, _| {},
        |rt, layer| assert_eq!(rt.set_trainable(layer, "fc.bias", false).unwrap(), 1),
    );
    for e in errors {
        assert!(
            e.contains("the ranks' gradients differ at step 0")
                && e.contains("rank 0 has 2 buffer(s) of [16, 4] elements, rank 1 has 1 of [16]"),
            "{e}"
        );
    }
}

/// Ranks that step different optimizers are an error on every rank naming the first rank whose
/// optimizer differs and both descriptions, and no rank updates: a rate of its own on rank 1
/// (hyper-parameters, checked at every step), or a state of its own at the group's first step
/// (momentum loaded through the session, which `data_parallel` does not see: it copies rank
/// 0's parameters, not the optimizers' state). `rank1` prepares rank 1's optimizer.
fn ranks_with_optimizers(rank1: Rank1Before) {
    for e in first_steps_failing(rank1, |_, _| {}) {
        assert!(
            e.contains("the ranks' optimizers differ at step 0: rank 0's is `momentum lr 0.1 ")
                && e.contains("rank 1's is `momentum lr "),
            "{e}"
        );
    }
}

#[test]
fn ranks_whose_optimizers_differ_are_an_error_naming_the_rank() {
    // A rate of its own.
    ranks_with_optimizers(|_, opt| opt.lr = 0.2);
    // Momentum of its own, loaded through the session: the same hyper-parameters and steps
    // done, another state.
    ranks_with_optimizers(|rt, opt| {
        let mut other = eager_f32();
        let layer = Linear::new(&other.vars().pp("fc"), 4, 4).unwrap();
        let mut o = opt.clone();
        let x = tl_spec::Tensor::<f32>::from_fn([2, 4], |i| i as f32 * 0.3);
        other
            .step(&layer, &mut o, |g| layer.forward(&g.input(x)?)?.sum())
            .unwrap();
        let state = other.session().optimizer_state(&o).unwrap();
        rt.session_mut().load_optimizer_state(opt, &state).unwrap();
        assert_eq!(opt.steps_done(), 0);
    });
}

/// The NCCL engine (features `cuda`, `cuda-emu`) with [`Local`] as its bootstrap: one rank, on
/// the NCCL that `TL_NCCL_LIBRARY` names (CI: the one-rank stub of `cargo xtask nccl-stub`, over
/// the kernel emulator, where its copies really run). Without the variable or a device the
/// tests that need them print why and skip (CI checks that they did not).
/// `eval "$(cargo xtask nccl-stub)"; cargo test -p tl-nn --features cuda-emu --test nn dist::nccl::`
#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
mod nccl {
    use super::*;
    use tl_nn::dist::Nccl;

    /// The engine over `Local`, or `None` after saying why not.
    fn engine() -> Option<Nccl> {
        if std::env::var_os("TL_NCCL_LIBRARY").is_none() {
            println!("TL_NCCL_LIBRARY not set: skipping (eval \"$(cargo xtask nccl-stub)\")");
            return None;
        }
        match Nccl::init(Box::new(Local)) {
            Ok(e) => Some(e),
            Err(e) if e.to_string().contains("no CUDA device") => {
                println!("no CUDA device: skipping ({e})");
                None
            }
            Err(e) => panic!("Nccl::init: {e}"),
        }
    }

    #[test]
    fn the_nccl_engine_over_local_steps_bit_for_bit_as_no_group() {
        let Some(probe) = engine() else {
            return;
        };
        println!("{}", probe.library());
        // The collectives run on the device: values come back bit for bit (f64 as two words).
        let before = probe.traffic();
        let x: Vec<f32> = (0..999).map(|i| (i as f32).cos() * 3.5).collect();
        let mut y = x.clone();
        probe.all_reduce_sum_f32(&mut y).unwrap();
        assert_eq!(y, x);
        probe.broadcast_f32(&mut y).unwrap();
        assert_eq!(y, x);
        let z: Vec<f64> = (0..333).map(|i| (i as f64).sin() / 7.0).collect();
        let mut w = z.clone();
        probe.all_reduce_sum_f64(&mut w).unwrap();
        probe.broadcast_f64(&mut w).unwrap();
        assert_eq!(
            w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            z.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let t = probe.traffic();
        assert_eq!(t.uploads - before.uploads, 4, "one upload per collective");
        assert_eq!(
            t.downloads - before.downloads,
            4,
            "one download per collective"
        );
        drop(probe);
        for bucket in [7, tl_nn::dist::DEFAULT_BUCKET_ELEMS] {
            let nccl = || Box::new(engine().unwrap()) as Box<dyn Collective>;
            let (alone, group) = alone_and_in(eager_f32, nccl, bucket, true);
            assert_eq!(alone, group, "bucket {bucket}");
            let (alone, group) = alone_and_in(linked_f64, nccl, bucket, false);
            assert_eq!(alone, group, "linked f64, bucket {bucket}");
            // The model on the CUDA device too: its gradients are reduced there.
            let cuda = || eager::<f32>(Backend::Cuda, 0);
            let (alone, group) = alone_and_in(cuda, nccl, bucket, true);
            assert_eq!(alone, group, "eager on the CUDA device, bucket {bucket}");
            let cuda = || linked_on(Backend::Cuda, 0);
            let (alone, group) = alone_and_in(cuda, nccl, bucket, true);
            assert_eq!(alone, group, "linked on the CUDA device, bucket {bucket}");
        }
    }

    /// A session on the CUDA device in an NCCL group reduces its gradients in device memory:
    /// its step copies between host and device exactly what a step without a group copies (the
    /// loss), where the host round trip would add a download and an upload per gradient. The
    /// parameters are those of no group, bit for bit.
    #[test]
    fn on_the_cuda_device_the_gradients_never_leave_it() {
        if engine().is_none() {
            return;
        }
        fn check<O: Train>(what: &str, make: impl Fn() -> Runtime<O>) {
            for bucket in [7, tl_nn::dist::DEFAULT_BUCKET_ELEMS] {
                let (alone, t_alone) = train_traffic(make(), None, 32, 3, bucket, true);
                let comm = Box::new(engine().unwrap());
                let (nccl, t_nccl) = train_traffic(make(), Some(comm), 32, 3, bucket, true);
                assert_eq!(alone, nccl, "{what}, bucket {bucket}");
                let (a, n) = (t_alone.unwrap(), t_nccl.unwrap());
                assert!(a.downloads > 0, "{what}: the loss is read: {a:?}");
                assert_eq!(
                    (n.uploads, n.upload_bytes, n.downloads, n.download_bytes),
                    (a.uploads, a.upload_bytes, a.downloads, a.download_bytes),
                    "{what}, bucket {bucket}: a step in the group copies more than one alone \
                     (a host round trip of the gradients?): {n:?} against {a:?}"
                );
                // The mean's division on the device: a fill and a division per gradient (4).
                assert_eq!(n.launches, a.launches + 8, "{what}: {n:?} against {a:?}");
            }
        }
        check("eager", || eager::<f32>(Backend::Cuda, 0));
        check("linked", || linked_on(Backend::Cuda, 0));
    }

    /// NCCL with a planted bug in its device all-reduce: every sum comes back doubled.
    struct Doubled(Nccl);

    impl Collective for Doubled {
        fn rank(&self) -> usize {
            self.0.rank()
        }
        fn size(&self) -> usize {
            self.0.size()
        }
        fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> tl_nn::Result<()> {
            self.0.all_reduce_sum_f32(buf)
        }
        fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> tl_nn::Result<()> {
            self.0.all_reduce_sum_f64(buf)
        }
        fn broadcast_f32(&self, buf: &mut [f32]) -> tl_nn::Result<()> {
            self.0.broadcast_f32(buf)
        }
        fn broadcast_f64(&self, buf: &mut [f64]) -> tl_nn::Result<()> {
            self.0.broadcast_f64(buf)
        }
        fn all_gather_bytes(&self, mine: &[u8]) -> tl_nn::Result<Vec<Vec<u8>>> {
            self.0.all_gather_bytes(mine)
        }
        fn reduces_on_device(&self) -> bool {
            self.0.reduces_on_device()
        }
        fn all_reduce_sum_device(
            &self,
            dev: &mut tl_tape_cuda::CudaDevice,
            bufs: &[tl_tape_cuda::Buffer],
        ) -> tl_nn::Result<()> {
            use tl_tape_cuda::Device;
            self.0.all_reduce_sum_device(dev, bufs)?;
            for &b in bufs {
                dev.axpy_assign(b, 1.0, b)?;
            }
            Ok(())
        }
    }

    /// The planted doubled sum (in the device path only: the host collectives are NCCL's own)
    /// moves the parameters away from no group's, so the check above would catch a wrong mean
    /// on the device, and a return of the host path would leave this one equal.
    #[test]
    fn a_planted_wrong_mean_on_the_device_is_caught() {
        if engine().is_none() {
            return;
        }
        let cuda = || eager::<f32>(Backend::Cuda, 0);
        let alone = train(cuda(), None, 32, 3, 100, false);
        let doubled = Box::new(Doubled(engine().unwrap()));
        let wrong = train(cuda(), Some(doubled), 32, 3, 100, false);
        assert!(
            worst(&alone, &wrong) > 1e-4,
            "the doubled mean went unnoticed"
        );
        let cuda = || linked_on(Backend::Cuda, 0);
        let alone = train(cuda(), None, 32, 3, 100, false);
        let doubled = Box::new(Doubled(engine().unwrap()));
        let wrong = train(cuda(), Some(doubled), 32, 3, 100, false);
        assert!(
            worst(&alone, &wrong) > 1e-4,
            "linked: the doubled mean went unnoticed"
        );
    }

    /// A bootstrap that stands for `Mpi` with a lost rank 1: its exchanges pass, except the
    /// empty one the NCCL engine makes after a collective failed, which fails as `Mpi`'s
    /// timeout does, naming the rank that did not answer.
    struct LostAfterNccl;

    impl Collective for LostAfterNccl {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            1
        }
        fn all_reduce_sum_f32(&self, _: &mut [f32]) -> tl_nn::Result<()> {
            Ok(())
        }
        fn all_reduce_sum_f64(&self, _: &mut [f64]) -> tl_nn::Result<()> {
            Ok(())
        }
        fn broadcast_f32(&self, _: &mut [f32]) -> tl_nn::Result<()> {
            Ok(())
        }
        fn broadcast_f64(&self, _: &mut [f64]) -> tl_nn::Result<()> {
            Ok(())
        }
        fn all_gather_bytes(&self, mine: &[u8]) -> tl_nn::Result<Vec<Vec<u8>>> {
            if mine.is_empty() {
                return Err(tl_nn::Error::Usage {
                    what: "Mpi (collective)",
                    detail: "rank(s) [1] did not answer within 0.2 s".into(),
                });
            }
            Ok(vec![mine.to_vec()])
        }
    }

    /// Run the test `name` again in a child process with the stub's `TL_NCCL_STUB_HANG=k` (a
    /// communicator's collectives after the first `k` never finish: a lost rank), and check
    /// that it passed within a minute (the child's timeouts are far shorter; a hang fails).
    fn run_hanging(name: &str, k: usize) {
        let limit = std::time::Duration::from_secs(60);
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env("TL_NCCL_STUB_HANG", k.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > limit {
                child.kill().ok();
                panic!("{name} with a hanging NCCL did not end within {limit:?}: a hang");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{name} with a hanging NCCL failed:\n{text}"
        );
        assert!(text.contains("1 passed"), "{name} did not run:\n{text}");
    }

    /// A rank lost inside the step's device all-reduce: the other ranks' step is an error
    /// after the NCCL timeout (not a hang) that names the lost rank when the bootstrap's
    /// exchange does, and says NCCL itself stalled when every rank answers it; no parameter
    /// changes. Runs in a child process with the stub's hanging mode after the MLP's four
    /// parameter broadcasts (`TL_NCCL_STUB_HANG=4`); skips on a real NCCL.
    #[test]
    fn a_rank_lost_inside_an_nccl_all_reduce_is_an_error_naming_it() {
        if std::env::var_os("TL_NCCL_STUB_HANG").is_none() {
            let Some(probe) = engine() else {
                return;
            };
            if !probe.library().starts_with("NCCL 0.0.0") {
                println!("not the stub ({}): skipping", probe.library());
                return;
            }
            let name = "dist::nccl::a_rank_lost_inside_an_nccl_all_reduce_is_an_error_naming_it";
            return run_hanging(name, 4);
        }
        let (train, _) = digits().unwrap();
        let (x, labels) = DataLoader::new(&train, 8, Classify { classes: CLASSES })
            .unwrap()
            .epoch(0)
            .next()
            .unwrap()
            .unwrap();
        let timeout = std::time::Duration::from_millis(200);
        let bootstraps: [(Box<dyn Collective>, &str); 2] = [
            (
                Box::new(LostAfterNccl),
                "the ranks' exchange after it: Mpi (collective): rank(s) [1] did not answer",
            ),
            (
                Box::new(Local),
                "every rank answered the exchange after it, so no rank is lost: NCCL itself stalled",
            ),
        ];
        for (bootstrap, says) in bootstraps {
            let mut rt = eager::<f32>(Backend::Cuda, 0);
            let model = mlp(&rt);
            let comm = Nccl::init(bootstrap).unwrap().with_timeout(timeout);
            assert_eq!(comm.timeout(), timeout);
            rt.data_parallel(&model, Box::new(comm)).unwrap();
            let before = values(&rt, &model);
            let start = std::time::Instant::now();
            let e = rt
                .step(&model, &mut optimizer(false), |g| {
                    model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
                })
                .unwrap_err()
                .to_string();
            assert!(start.elapsed() >= timeout, "{e}");
            assert!(
                e.contains("ncclAllReduce")
                    && e.contains("not finished after 0.200 s (the timeout)")
                    && e.contains(says),
                "{e}"
            );
            assert_eq!(values(&rt, &model), before, "no parameter changed");
            // The engine's communicator is gone: the next step is an error at once.
            let e = rt
                .step(&model, &mut optimizer(false), |g| {
                    model.forward(&g.input(x.clone())?)?.cross_entropy(&labels)
                })
                .unwrap_err()
                .to_string();
            assert!(e.contains("the communicator was aborted"), "{e}");
        }
    }

    #[test]
    fn two_ranks_on_the_one_rank_stub_are_a_clear_error_on_each() {
        let Some(probe) = engine() else {
            return;
        };
        if !probe.library().starts_with("NCCL 0.0.0") {
            // A real NCCL would run the two ranks (threads of one process, one GPU).
            println!("not the stub ({}): skipping", probe.library());
            return;
        }
        drop(probe);
        let handles: Vec<_> = group(2)
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    Nccl::init(Box::new(c))
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        for (rank, h) in handles.into_iter().enumerate() {
            let e = h.join().unwrap().unwrap_err();
            assert!(
                e.contains(&format!(
                    "ncclCommInitRank: NCCL: rank {rank} of 2: returned 5"
                )) && e.contains("more than one rank needs the real libnccl.so.2"),
                "rank {rank}: {e}"
            );
        }
    }

    #[test]
    fn a_rank_without_nccl_stops_every_rank_with_an_error_naming_it() {
        let err = Nccl::init_with_library("/nonexistent/libnccl.so.2", Box::new(Local))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot load /nonexistent/libnccl.so.2")
                && err.contains("TL_NCCL_LIBRARY"),
            "{err}"
        );
        let Some(lib) = std::env::var_os("TL_NCCL_LIBRARY") else {
            println!("TL_NCCL_LIBRARY not set: skipping the two-rank part");
            return;
        };
        // Rank 0 has the library, rank 1 does not: both stop before NCCL's rendezvous.
        let libs = [lib, "/nonexistent/libnccl.so.2".into()];
        let handles: Vec<_> = group(2)
            .into_iter()
            .zip(libs)
            .map(|(c, lib)| {
                std::thread::spawn(move || {
                    Nccl::init_with_library(lib, Box::new(c))
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        let out: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let e0 = out[0].as_ref().unwrap_err();
        let e1 = out[1].as_ref().unwrap_err();
        if e0.contains("no CUDA device") {
            println!("no CUDA device: skipping ({e0})");
            return;
        }
        assert!(
            e0.contains("rank 1 could not start NCCL") && e0.contains("cannot load /nonexistent"),
            "{e0}"
        );
        assert!(e1.contains("cannot load /nonexistent"), "{e1}");
    }
}

/// Gradient accumulation in a group: each of two ranks steps from the mean of its two
/// micro-batches, the group from the mean over the ranks: the same parameters as one rank
/// stepping on the whole batch (and a group of one is `step_accumulated` alone, bit for bit);
/// a failing micro-batch on one rank fails both, and neither updates.
#[test]
fn accumulated_steps_in_a_group_match_one_rank_on_the_whole_batch() {
    /// The parameters after three accumulated steps of `micro` micro-batches on this rank of
    /// `comm` (alone: `None`); `plant`: the micro-batch whose loss closure fails here;
    /// `fails`: the first step is expected to fail (here or on another rank).
    fn run(
        comm: Option<Box<dyn Collective>>,
        micro: usize,
        plant: Option<usize>,
        fails: bool,
    ) -> Vec<f64> {
        let mut rt = eager::<f64>(Backend::Cpu, 0);
        let model = mlp(&rt);
        let (train, _) = digits().unwrap();
        let mut loader = DataLoader::new(&train, 16, Classify { classes: CLASSES })
            .unwrap()
            .shuffle(5);
        if let Some(comm) = comm {
            let (rank, size) = (comm.rank(), comm.size());
            rt.data_parallel(&model, comm).unwrap();
            loader = loader.shard(rank, size).unwrap();
        }
        let mut opt = optimizer(true);
        for (x, labels) in loader.epoch(0).take(3).map(Result::unwrap) {
            let x = x.cast::<f64>();
            let rows = labels.len() / micro;
            let r = rt.step_accumulated(&model, &mut opt, micro, |g, i| {
                let idx: Vec<usize> = (i * rows..(i + 1) * rows).collect();
                let width = x.shape().dims()[1];
                let part = Tensor::new(
                    [rows, width],
                    idx.iter()
                        .flat_map(|&r| x.data()[r * width..(r + 1) * width].to_vec())
                        .collect(),
                )?;
                if plant == Some(i) {
                    return Err(tl_nn::Error::from(tl_session::Error::Usage {
                        what: "test",
                        detail: "a planted failure".into(),
                    }));
                }
                model
                    .forward(&g.input(part)?)?
                    .cross_entropy(&labels.select(&idx)?)
            });
            if fails {
                let e = r.unwrap_err().to_string();
                assert!(e.contains("planted") || e.contains("failed"), "{e}");
                assert_eq!(opt.steps_done(), 0);
                return values(&rt, &model);
            }
            r.unwrap();
        }
        values(&rt, &model)
    }
    use tl_spec::Tensor;
    let alone = run(None, 4, None, false);
    let one = run(Some(Box::new(Local)), 4, None, false);
    assert_eq!(one, alone);
    let whole = run(None, 1, None, false);
    assert!(worst(&alone, &whole) < 1e-12);
    let two: Vec<Vec<f64>> = group(2)
        .into_iter()
        .map(|c| std::thread::spawn(move || run(Some(Box::new(c)), 2, None, false)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(two[0], two[1], "the ranks agree bit for bit");
    assert!(worst(&two[0], &whole) < 1e-12, "{}", worst(&two[0], &whole));
    // Rank 1 fails in its first micro-batch: both ranks' steps fail, nothing moves.
    let start = {
        let rt = eager::<f64>(Backend::Cpu, 0);
        values(&rt, &mlp(&rt))
    };
    let failed: Vec<Vec<f64>> = group(2)
        .into_iter()
        .map(|c| {
            let plant = (c.rank == 1).then_some(0);
            std::thread::spawn(move || run(Some(Box::new(c)), 2, plant, true))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(failed, vec![start.clone(), start]);
}

/// An engine that misreports its world: `rank` of `size`, its all-gather returning `records`
/// copies of this rank's record.
struct Misreported {
    rank: usize,
    size: usize,
    records: usize,
}

impl Collective for Misreported {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_reduce_sum_f32(&self, _: &mut [f32]) -> tl_nn::Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _: &mut [f64]) -> tl_nn::Result<()> {
        Ok(())
    }
    fn broadcast_f32(&self, _: &mut [f32]) -> tl_nn::Result<()> {
        Ok(())
    }
    fn broadcast_f64(&self, _: &mut [f64]) -> tl_nn::Result<()> {
        Ok(())
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> tl_nn::Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec(); self.records])
    }
}

/// A user's engine that reports no rank, a rank past its world or an all-gather short of the
/// world is an error naming the numbers when the runtime joins the group (it indexed out of
/// bounds), and the runtime stays out of any group.
#[test]
fn an_engine_that_misreports_its_world_is_refused_when_joining() {
    for (rank, size, records, want) in [
        (0, 0, 0, "rank 0 of a world of 0"),
        (3, 2, 2, "rank 3 of a world of 2"),
        (0, 2, 1, "returned 1 record(s) for a world of 2"),
        (1, 2, 3, "returned 3 record(s) for a world of 2"),
    ] {
        let mut rt = eager::<f32>(Backend::Cpu, 0);
        let model = Linear::new(&rt.vars().pp("0"), 4, 3).unwrap();
        let engine = Box::new(Misreported {
            rank,
            size,
            records,
        });
        let e = rt.data_parallel(&model, engine).unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
        assert_eq!(rt.rank(), 0, "{want}: joined a group");
    }
}
