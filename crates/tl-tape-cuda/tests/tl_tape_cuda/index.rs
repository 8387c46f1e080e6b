//! The activation and index primitives on the simulation device with hand-worked values, their
//! argument checks, and the tape's Nat-environment snapshot for ops that read it.

use tl_ir::Op;
use tl_spec::Tensor;
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, SimDevice};

fn run(dev: &mut SimDevice, b: tl_tape_cuda::Buffer) -> Vec<f32> {
    let v = dev.download(b).unwrap();
    dev.release(b);
    v
}

#[test]
fn gelu_and_silu_match_hand_values_and_stay_finite_when_saturated() {
    let mut d = SimDevice::new();
    let x = d.upload(&[0.0, 1.0, -1e20, 1e20]).unwrap();
    let g = d.upload(&[1.0, 1.0, 1.0, 2.0]).unwrap();
    let y = d.gelu(x).unwrap();
    let y = run(&mut d, y);
    // gelu(1) = 0.8411919906082768 (docs/semantics.md); gelu(−∞-ish) = −0, gelu(+big) = x.
    assert_eq!(y[0], 0.0);
    assert!((y[1] - 0.841_192).abs() < 1e-6, "{y:?}");
    assert_eq!(y[2], 0.0);
    assert_eq!(y[3], 1e20);
    let dy = d.gelu_bwd(x, g).unwrap();
    let dy = run(&mut d, dy);
    // gelu'(0) = 0.5; gelu'(1) = 0.5(1+t) + 0.5·sech²·c·(1+3a), t = tanh(c·1.044715).
    let (c, a) = (0.797_884_560_802_865_4f64, 0.044_715f64);
    let t = (c * (1.0 + a)).tanh();
    let want1 = 0.5 * (1.0 + t) + 0.5 * (1.0 - t * t) * c * (1.0 + 3.0 * a);
    let dy1 = d.upload(&[1.0]).unwrap();
    let one = d.upload(&[1.0]).unwrap();
    let got1 = d.gelu_bwd(dy1, one).unwrap();
    let got1 = run(&mut d, got1);
    assert!(
        (f64::from(got1[0]) - want1).abs() < 1e-6,
        "{got1:?} vs {want1}"
    );
    // Saturated: no 0·∞ = NaN; the derivative is 0 far left and g far right.
    assert_eq!(dy, vec![0.5, got1[0], 0.0, 2.0]);
    let s = d.silu(x).unwrap();
    let s = run(&mut d, s);
    assert_eq!(s[0], 0.0);
    assert!((s[1] - 0.731_058_6).abs() < 1e-6, "{s:?}");
    assert_eq!(&s[2..], &[-0.0, 1e20]);
    let ds = d.silu_bwd(x, g).unwrap();
    let ds = run(&mut d, ds);
    // silu'(0) = 0.5, silu'(1) = s(1 + (1 − s)) with s = sigmoid(1).
    let s1 = 1.0 / (1.0 + (-1.0f64).exp());
    assert_eq!(ds[0], 0.5);
    assert!((f64::from(ds[1]) - s1 * (2.0 - s1)).abs() < 1e-6, "{ds:?}");
    assert!(ds.iter().all(|v| v.is_finite()), "{ds:?}");
    d.release_all([x, g, dy1, one]);
    assert_eq!(d.live_buffers(), 0);
}

#[test]
fn gathers_zero_fill_out_of_range_rows_and_scatters_accumulate_repeats() {
    let mut d = SimDevice::new();
    // x (3, 2) = [[1, 2], [3, 4], [5, 6]].
    let x = d.upload(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let y = d.gather_rows(x, 3, 2, &[2, 0, 3, 2, usize::MAX]).unwrap();
    assert_eq!(
        run(&mut d, y),
        vec![5.0, 6.0, 1.0, 2.0, 0.0, 0.0, 5.0, 6.0, 0.0, 0.0]
    );
    // g (5, 2) scattered back: row 2 gets g0 + g3, row 0 gets g1, rows 3 and MAX nothing.
    let g = d
        .upload(&[1.0, 10.0, 2.0, 20.0, 4.0, 40.0, 8.0, 80.0, 16.0, 160.0])
        .unwrap();
    let dx = d
        .scatter_add_rows(g, 3, 2, &[2, 0, 3, 2, usize::MAX])
        .unwrap();
    assert_eq!(run(&mut d, dx), vec![2.0, 20.0, 0.0, 0.0, 9.0, 90.0]);
    // Lengths that disagree with the dims are errors naming the primitive.
    let e = d.gather_rows(x, 2, 2, &[0]).unwrap_err().to_string();
    assert!(e.contains("gather_rows"), "{e}");
    let e = d.scatter_add_rows(g, 3, 2, &[0]).unwrap_err().to_string();
    assert!(
        e.contains("scatter_add_rows") && e.contains("cotangent"),
        "{e}"
    );
    // No column: an empty output, however many rows, with no plan of rows + 1 offsets built
    // (u32::MAX rows took 32 GiB of host memory).
    let none = d.upload(&[]).unwrap();
    let e = d.scatter_add_rows(none, u32::MAX as usize, 0, &[]).unwrap();
    assert_eq!(run(&mut d, e), Vec::<f32>::new());
    d.release_all([x, g, none]);
    assert_eq!(d.live_buffers(), 0);
}

#[test]
fn range_primitives_copy_place_join_and_add_in_bounds_only() {
    let mut d = SimDevice::new();
    let x = d.upload(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
    let v = d.upload(&[10.0, 20.0]).unwrap();
    let c = d.copy_range(x, 1, 3).unwrap();
    assert_eq!(run(&mut d, c), vec![2.0, 3.0, 4.0]);
    let p = d.place_range(v, 5, 2).unwrap();
    assert_eq!(run(&mut d, p), vec![0.0, 0.0, 10.0, 20.0, 0.0]);
    let j = d.concat(v, x).unwrap();
    assert_eq!(run(&mut d, j), vec![10.0, 20.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let a = d.add_range(x, v, 3).unwrap();
    assert_eq!(run(&mut d, a), vec![1.0, 2.0, 3.0, 14.0, 25.0]);
    for (e, op) in [
        (d.copy_range(x, 3, 3).unwrap_err(), "copy_range"),
        (d.place_range(v, 3, 2).unwrap_err(), "place_range"),
        (d.add_range(x, v, 4).unwrap_err(), "add_range"),
    ] {
        let e = e.to_string();
        assert!(e.contains(op) && e.contains("outside"), "{e}");
    }
    d.release_all([x, v]);
    assert_eq!(d.live_buffers(), 0);
}

#[test]
fn cross_entropy_rows_match_hand_values_and_skip_out_of_range_labels() {
    let mut d = SimDevice::new();
    // Row 0: [0, 0], label 0 → ln 2. Row 1: [ln 3, 0], label 1 → ln 4 − 0. Row 2: label 9 → 0.
    let l3 = 3.0f32.ln();
    let x = d.upload(&[0.0, 0.0, l3, 0.0, 5.0, 1.0]).unwrap();
    let per = d.cross_entropy_rows(x, 3, 2, &[0, 1, 9]).unwrap();
    let per = run(&mut d, per);
    assert!((per[0] - 2f32.ln()).abs() < 1e-6, "{per:?}");
    assert!((per[1] - 4f32.ln()).abs() < 1e-6, "{per:?}");
    assert_eq!(per[2], 0.0);
    // g = 3 over 3 rows: k = 1. Row 0: [0.5 − 1, 0.5]; row 1: [0.75, 0.25 − 1]; row 2: zeros.
    let g = d.upload(&[3.0]).unwrap();
    let dx = d.cross_entropy_rows_bwd(x, g, 3, 2, &[0, 1, 9]).unwrap();
    let dx = run(&mut d, dx);
    let want = [-0.5, 0.5, 0.75, -0.75, 0.0, 0.0];
    for (a, b) in dx.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{dx:?}");
    }
    let e = d.cross_entropy_rows(x, 3, 2, &[0]).unwrap_err().to_string();
    assert!(
        e.contains("cross_entropy_rows") && e.contains("label"),
        "{e}"
    );
    d.release_all([x, g]);
    assert_eq!(d.live_buffers(), 0);
}

#[test]
fn nat_reading_nodes_keep_the_environment_they_were_recorded_with() {
    let mut tape = CudaTape::new(SimDevice::new());
    let x = Tensor::new([3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let x = tape.upload_leaf(&x, Some("x"), true).unwrap();
    tape.set_nats(vec![2, 2]);
    let y = tape
        .apply(&Op::GatherRowsNatVec { at: 0, k: 2 }, &[x])
        .unwrap();
    assert_eq!(tape.read::<f32>(y).unwrap().data(), &[5.0, 6.0, 5.0, 6.0]);
    // The environment changes after recording; the backward still scatters into row 2, twice.
    tape.set_nats(vec![0, 1]);
    let seed = AnyBuffer::upload(
        tape.device_mut(),
        &Tensor::new([2, 2], vec![1.0f32; 4]).unwrap(),
    )
    .unwrap();
    let grads = tape.backward_dense(y, &seed).unwrap();
    let gx: Tensor<f32> = grads[x].download(tape.device()).unwrap();
    assert_eq!(gx.data(), &[0.0, 0.0, 0.0, 0.0, 2.0, 2.0]);
    tape.release_grads(grads);
    tape.device_mut().release(seed.buffer());
    tape.reset();
    assert_eq!(tape.device().live_buffers(), 0);
}
