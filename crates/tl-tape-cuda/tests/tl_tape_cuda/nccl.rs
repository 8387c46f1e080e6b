//! NCCL over `CudaDevice` buffers (the `nccl` module; features `cuda`, `cuda-emu`).
//!
//! The loader's errors run everywhere. The collectives need a library: the file
//! `TL_NCCL_LIBRARY` names (CI: the one-rank stub of `cargo xtask nccl-stub`, whose copies
//! really run on the kernel emulator's host buffers; on a GPU: the real libnccl.so.2). Without
//! the variable, or without a device, those tests print why and skip (CI checks that they
//! did not). With one rank an all-reduce and a broadcast return their input, bit for bit.
//!
//! `eval "$(cargo xtask nccl-stub)"; cargo test -p tl-tape-cuda --features cuda-emu --test tl_tape_cuda nccl::`
#![cfg(any(feature = "cuda", feature = "cuda-emu"))]

use std::sync::Arc;

use tl_tape_cuda::nccl::{Elem, LIBRARY_VAR, Nccl, NcclComm, NcclVersion, UniqueId};
use tl_tape_cuda::{CudaDevice, Device, Error};

/// The library `TL_NCCL_LIBRARY` names and a device, or `None` after saying why not.
fn setup() -> Option<(Arc<Nccl>, CudaDevice)> {
    if std::env::var_os(LIBRARY_VAR).is_none() {
        println!(
            "{LIBRARY_VAR} not set: skipping (eval \"$(cargo xtask nccl-stub)\" sets it to the stub)"
        );
        return None;
    }
    let dev = match CudaDevice::new() {
        Ok(d) => d,
        Err(e @ Error::NoDevice { .. }) => {
            println!("no CUDA device: skipping ({e})");
            return None;
        }
        Err(e) => panic!("CUDA device init failed: {e}"),
    };
    Some((Nccl::load().unwrap(), dev))
}

/// The NCCL error's call and detail.
fn nccl_err<T: std::fmt::Debug>(r: Result<T, Error>) -> (&'static str, String) {
    match r {
        Err(Error::Nccl { call, detail }) => (call, detail),
        other => panic!("expected an NCCL error, got {other:?}"),
    }
}

#[test]
fn a_missing_library_is_an_error_naming_it_and_the_variable() {
    let (call, d) = nccl_err(Nccl::open("/nonexistent/libnccl.so.2"));
    assert_eq!(call, "load NCCL");
    assert!(
        d.contains("cannot load /nonexistent/libnccl.so.2") && d.contains("TL_NCCL_LIBRARY"),
        "{d}"
    );
    // A library that is not NCCL: the first missing symbol is named.
    let (_, d) = nccl_err(Nccl::open("libm.so.6"));
    assert!(
        d.contains("libm.so.6") && d.contains("has no symbol ncclGetVersion"),
        "{d}"
    );
}

#[test]
fn unique_ids_round_trip_through_bytes_of_the_right_length() {
    let (call, d) = nccl_err(UniqueId::from_bytes(&[0u8; 127]));
    assert_eq!(call, "UniqueId::from_bytes");
    assert!(d.contains("128 bytes, got 127"), "{d}");
    let bytes: Vec<u8> = (0..128u8).collect();
    assert_eq!(
        UniqueId::from_bytes(&bytes).unwrap().as_bytes()[..],
        bytes[..]
    );
    assert_eq!(NcclVersion::from_code(22_105).to_string(), "2.21.5");
    assert_eq!(NcclVersion::from_code(2_408).to_string(), "2.4.8");
}

#[test]
fn one_rank_all_reduce_and_broadcast_return_the_input_bit_for_bit() {
    let Some((nccl, mut dev)) = setup() else {
        return;
    };
    let v = nccl.version().unwrap();
    println!("NCCL {v} from {}", nccl.path());
    let id = nccl.unique_id().unwrap();
    let id = UniqueId::from_bytes(id.as_bytes()).unwrap();
    let mut comm = NcclComm::init(&nccl, &id, 0, 1).unwrap();
    assert_eq!((comm.rank(), comm.size()), (0, 1));
    let live = dev.live_buffers();
    let x: Vec<f32> = (0..1000)
        .map(|i| (i as f32 * 0.37 - 100.0).sin() * 1e3)
        .collect();
    let b = dev.upload(&x).unwrap();
    use crate::common::bits;
    let s = comm.all_reduce_sum(&mut dev, b, Elem::F32).unwrap();
    assert_ne!(s.id(), b.id(), "a fresh buffer");
    assert_eq!(bits(&dev.download(s).unwrap()), bits(&x));
    let c = comm.broadcast(&mut dev, b, 0, Elem::F32).unwrap();
    assert_eq!(bits(&dev.download(c).unwrap()), bits(&x));
    assert_eq!(bits(&dev.download(b).unwrap()), bits(&x), "input unchanged");
    // f64 values as two words each: the bits come back whole.
    let y: Vec<f64> = (0..300).map(|i| (i as f64).sqrt() * 1e-7 - 3.0).collect();
    let words: Vec<f32> = y
        .iter()
        .flat_map(|v| {
            let u = v.to_bits();
            [f32::from_bits(u as u32), f32::from_bits((u >> 32) as u32)]
        })
        .collect();
    let w = dev.upload(&words).unwrap();
    let r = comm.all_reduce_sum(&mut dev, w, Elem::F64).unwrap();
    assert_eq!(bits(&dev.download(r).unwrap()), bits(&words));
    // An empty buffer: an empty result, no call.
    let e = dev.upload(&[]).unwrap();
    let re = comm.all_reduce_sum(&mut dev, e, Elem::F32).unwrap();
    assert_eq!(dev.download(re).unwrap(), Vec::<f32>::new());
    for buf in [b, s, c, w, r, e, re] {
        assert!(dev.release(buf));
    }
    assert_eq!(dev.live_buffers(), live);
}

/// The in-place all-reduce of several buffers (one NCCL group): with one rank every buffer
/// keeps its bits, no buffer is made and nothing is copied between host and device; a bad
/// length or a released buffer anywhere in the list is an error before the group opens.
#[test]
fn one_rank_in_place_all_reduce_keeps_the_buffers_on_the_device() {
    let Some((nccl, mut dev)) = setup() else {
        return;
    };
    let id = nccl.unique_id().unwrap();
    let mut comm = NcclComm::init(&nccl, &id, 0, 1).unwrap();
    use crate::common::bits;
    let xs: Vec<Vec<f32>> = [7usize, 0, 1000, 1]
        .iter()
        .map(|&n| {
            (0..n)
                .map(|i| (i as f32 * 0.91 + n as f32).cos() * 1e2)
                .collect()
        })
        .collect();
    let bufs: Vec<_> = xs.iter().map(|x| dev.upload(x).unwrap()).collect();
    let (live, before) = (dev.live_buffers(), dev.traffic());
    comm.all_reduce_sum_in_place(&mut dev, &bufs, Elem::F32)
        .unwrap();
    let t = dev.traffic() - before;
    assert_eq!((t.uploads, t.downloads), (0, 0), "{t:?}");
    assert_eq!(dev.live_buffers(), live, "in place: no buffer made");
    for (b, x) in bufs.iter().zip(&xs) {
        assert_eq!(bits(&dev.download(*b).unwrap()), bits(x));
    }
    // An odd buffer for f64 values, and a released one, after a good one: errors naming the call.
    let (call, d) = nccl_err(comm.all_reduce_sum_in_place(&mut dev, &bufs, Elem::F64));
    assert_eq!(call, "ncclAllReduce");
    assert!(d.contains("7 words (odd)"), "{d}");
    dev.release(bufs[3]);
    match comm.all_reduce_sum_in_place(&mut dev, &bufs, Elem::F32) {
        Err(Error::Released { op, .. }) => assert_eq!(op, "ncclAllReduce"),
        other => panic!("expected a released-buffer error, got {other:?}"),
    }
    assert_eq!(bits(&dev.download(bufs[2]).unwrap()), bits(&xs[2]));
    comm.all_reduce_sum_in_place(&mut dev, &[], Elem::F32)
        .unwrap();
    for b in &bufs[..3] {
        assert!(dev.release(*b));
    }
}

/// Run the test `name` of this binary again in a child process with the stub's
/// `TL_NCCL_STUB_HANG=0` (its collectives never finish: a lost rank), and check that it
/// passed, within `limit` of wall time (the child's timeouts are far shorter; a hang fails).
fn run_hanging(name: &str, limit: std::time::Duration) {
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("TL_NCCL_STUB_HANG", "0")
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
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name} with a hanging NCCL failed:\n{text}"
    );
    assert!(text.contains("1 passed"), "{name} did not run:\n{text}");
}

/// A collective that never finishes (the stub's hanging mode: a rank that does not take part)
/// is an error after the communicator's timeout, not a hang; the communicator is aborted and
/// every later call on it is an error saying so. Run in a child process with the stub's
/// variable set; with a real NCCL (no hanging mode) it skips.
#[test]
fn a_collective_that_never_finishes_times_out_and_aborts_the_communicator() {
    if std::env::var_os("TL_NCCL_STUB_HANG").is_none() {
        let Some((nccl, _)) = setup() else {
            return;
        };
        if nccl.version().unwrap().code != 0 {
            println!("not the stub ({}): skipping", nccl.path());
            return;
        }
        let name = "nccl::a_collective_that_never_finishes_times_out_and_aborts_the_communicator";
        return run_hanging(name, std::time::Duration::from_secs(60));
    }
    let (nccl, mut dev) = setup().expect("the parent checked the library and the device");
    let id = nccl.unique_id().unwrap();
    let mut comm = NcclComm::init(&nccl, &id, 0, 1).unwrap();
    assert_eq!(comm.timeout(), tl_tape_cuda::nccl::DEFAULT_TIMEOUT);
    comm.set_timeout(std::time::Duration::from_millis(200));
    let live = dev.live_buffers();
    let x = dev.upload(&[1.0, 2.0, 3.0]).unwrap();
    let start = std::time::Instant::now();
    let (call, d) = nccl_err(comm.all_reduce_sum(&mut dev, x, Elem::F32));
    let waited = start.elapsed();
    assert_eq!(call, "ncclAllReduce");
    assert!(
        d.contains("rank 0 of 1")
            && d.contains("not finished after 0.200 s (the timeout)")
            && d.contains("the communicator is aborted"),
        "{d}"
    );
    assert!(
        waited >= std::time::Duration::from_millis(200),
        "{waited:?}"
    );
    assert!(comm.is_aborted());
    // Every later call: an error before NCCL is called (the communicator is gone).
    for r in [
        comm.all_reduce_sum_in_place(&mut dev, &[x], Elem::F32),
        comm.broadcast(&mut dev, x, 0, Elem::F32).map(|_| ()),
    ] {
        let (_, d) = nccl_err(r);
        assert!(d.contains("the communicator was aborted"), "{d}");
    }
    dev.release(x);
    assert_eq!(
        dev.live_buffers(),
        live,
        "the unfinished result was released"
    );
    // The in-place form times out the same way on a fresh communicator.
    let mut comm = NcclComm::init(&nccl, &id, 0, 1).unwrap();
    comm.set_timeout(std::time::Duration::from_millis(50));
    let y = dev.upload(&[4.0; 8]).unwrap();
    let (_, d) = nccl_err(comm.all_reduce_sum_in_place(&mut dev, &[y], Elem::F32));
    assert!(d.contains("not finished after 0.050 s"), "{d}");
    dev.release(y);
}

#[test]
fn bad_ranks_roots_and_lengths_are_errors_before_any_call() {
    let Some((nccl, mut dev)) = setup() else {
        return;
    };
    let id = nccl.unique_id().unwrap();
    let (_, d) = nccl_err(NcclComm::init(&nccl, &id, 1, 1));
    assert!(d.contains("rank 1 is not below the size 1"), "{d}");
    let (_, d) = nccl_err(NcclComm::init(&nccl, &id, 0, 0));
    assert!(d.contains("size 0"), "{d}");
    let huge = i32::MAX as usize + 1;
    let (_, d) = nccl_err(NcclComm::init(&nccl, &id, 0, huge));
    assert!(d.contains("does not fit NCCL's int"), "{d}");
    let mut comm = NcclComm::init(&nccl, &id, 0, 1).unwrap();
    let live = dev.live_buffers();
    let odd = dev.upload(&[1.0, 2.0, 3.0]).unwrap();
    let (call, d) = nccl_err(comm.all_reduce_sum(&mut dev, odd, Elem::F64));
    assert_eq!(call, "ncclAllReduce");
    assert!(d.contains("3 words (odd)"), "{d}");
    let (call, d) = nccl_err(comm.broadcast(&mut dev, odd, 1, Elem::F32));
    assert_eq!(call, "ncclBroadcast");
    assert!(d.contains("root 1 is not a rank"), "{d}");
    dev.release(odd);
    match comm.all_reduce_sum(&mut dev, odd, Elem::F32) {
        Err(Error::Released { op, .. }) => assert_eq!(op, "ncclAllReduce"),
        other => panic!("expected a released-buffer error, got {other:?}"),
    }
    assert_eq!(
        dev.live_buffers(),
        live,
        "no buffer left behind by the errors"
    );
}

#[test]
fn several_ranks_on_the_stub_are_a_clear_error() {
    let Some((nccl, _dev)) = setup() else {
        return;
    };
    if nccl.version().unwrap().code != 0 {
        // A real NCCL would wait for the second rank.
        println!("not the stub (NCCL {}): skipping", nccl.version().unwrap());
        return;
    }
    let id = nccl.unique_id().unwrap();
    let (call, d) = nccl_err(NcclComm::init(&nccl, &id, 0, 2));
    assert_eq!(call, "ncclCommInitRank");
    assert!(
        d.contains("rank 0 of 2: returned 5")
            && d.contains("one-rank NCCL stub")
            && d.contains(nccl.path()),
        "{d}"
    );
    // A token that is not the stub's is refused by it.
    let (_, d) = nccl_err(NcclComm::init(
        &nccl,
        &UniqueId::from_bytes(&[7; 128]).unwrap(),
        0,
        1,
    ));
    assert!(d.contains("returned 4 (invalid argument"), "{d}");
}
