//! The f32 wire format: f32 and f64 travel to the device, a scalar type without a declared wire
//! format is a clear error at upload (and download) — never a silent reinterpretation.

use std::fmt;
use std::iter::Sum;
use std::num::FpCategory;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Rem, Sub, SubAssign};

use num_traits::{Float, Num, NumCast, One, ToPrimitive, Zero};
use tl_ir::{GraphBuilder, Op, Recorder};
use tl_spec::{Scalar, Tensor};
use tl_tape_cuda::{AnyBuffer, CudaTape, Device, Error, SimDevice};

/// A real scalar type (an f64 in disguise) that declares no float32 wire format.
#[derive(Clone, Copy, Default, PartialEq, PartialOrd)]
struct Wide(f64);

impl fmt::Debug for Wide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Wide({})", self.0)
    }
}
impl fmt::Display for Wide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

macro_rules! binops {
    ($($tr:ident $m:ident $atr:ident $am:ident),*) => {$(
        impl $tr for Wide { type Output = Wide; fn $m(self, o: Wide) -> Wide { Wide(self.0.$m(o.0)) } }
        impl $atr for Wide { fn $am(&mut self, o: Wide) { self.0.$am(o.0) } }
    )*};
}
binops!(Add add AddAssign add_assign, Sub sub SubAssign sub_assign,
        Mul mul MulAssign mul_assign, Div div DivAssign div_assign);
impl Rem for Wide {
    type Output = Wide;
    fn rem(self, o: Wide) -> Wide {
        Wide(self.0 % o.0)
    }
}
impl Neg for Wide {
    type Output = Wide;
    fn neg(self) -> Wide {
        Wide(-self.0)
    }
}
impl Sum for Wide {
    fn sum<I: Iterator<Item = Wide>>(it: I) -> Wide {
        Wide(it.map(|w| w.0).sum())
    }
}
impl Zero for Wide {
    fn zero() -> Wide {
        Wide(0.0)
    }
    fn is_zero(&self) -> bool {
        self.0 == 0.0
    }
}
impl One for Wide {
    fn one() -> Wide {
        Wide(1.0)
    }
}
impl Num for Wide {
    type FromStrRadixErr = <f64 as Num>::FromStrRadixErr;
    fn from_str_radix(s: &str, r: u32) -> Result<Wide, Self::FromStrRadixErr> {
        f64::from_str_radix(s, r).map(Wide)
    }
}
impl ToPrimitive for Wide {
    fn to_i64(&self) -> Option<i64> {
        self.0.to_i64()
    }
    fn to_u64(&self) -> Option<u64> {
        self.0.to_u64()
    }
    fn to_f64(&self) -> Option<f64> {
        Some(self.0)
    }
}
impl NumCast for Wide {
    fn from<T: ToPrimitive>(n: T) -> Option<Wide> {
        n.to_f64().map(Wide)
    }
}

macro_rules! float_impl {
    (consts: $($c:ident),*; unary: $($u:ident),*; binary: $($b:ident),*; preds: $($p:ident),*) => {
        impl Float for Wide {
            $(fn $c() -> Wide { Wide(<f64 as Float>::$c()) })*
            $(fn $u(self) -> Wide { Wide(<f64 as Float>::$u(self.0)) })*
            $(fn $b(self, o: Wide) -> Wide { Wide(<f64 as Float>::$b(self.0, o.0)) })*
            $(fn $p(self) -> bool { <f64 as Float>::$p(self.0) })*
            fn classify(self) -> FpCategory { self.0.classify() }
            fn mul_add(self, a: Wide, b: Wide) -> Wide { Wide(self.0.mul_add(a.0, b.0)) }
            fn powi(self, n: i32) -> Wide { Wide(self.0.powi(n)) }
            fn sin_cos(self) -> (Wide, Wide) { let (s, c) = self.0.sin_cos(); (Wide(s), Wide(c)) }
            fn integer_decode(self) -> (u64, i16, i8) { <f64 as Float>::integer_decode(self.0) }
        }
    };
}
float_impl!(
    consts: nan, infinity, neg_infinity, neg_zero, min_value, min_positive_value, max_value;
    unary: floor, ceil, round, trunc, fract, abs, signum, recip, sqrt, exp, exp2, ln, log2,
        log10, cbrt, sin, cos, tan, asin, acos, atan, exp_m1, ln_1p, sinh, cosh, tanh, asinh,
        acosh, atanh;
    binary: powf, log, max, min, abs_sub, hypot, atan2;
    preds: is_nan, is_infinite, is_finite, is_normal, is_sign_positive, is_sign_negative
);

impl ndarray::ScalarOperand for Wide {}

impl Scalar for Wide {
    const NAME: &'static str = "wide";
    fn lit(v: f64) -> Wide {
        Wide(v)
    }
    fn as_f64(self) -> f64 {
        self.0
    }
}

#[test]
fn a_scalar_type_without_a_wire_format_is_a_clear_error() {
    let t = Tensor::<Wide>::from_fn([2, 2], |i| Wide(i as f64));
    let mut tape = CudaTape::new(SimDevice::new());
    // Directly, through the tape, and through the Recorder (what `GraphData::replay` calls).
    let e = AnyBuffer::upload(tape.device_mut(), &t).unwrap_err();
    assert_eq!(
        e,
        Error::NoWireFormat {
            op: "upload",
            scalar: "wide"
        }
    );
    let msg = e.to_string();
    assert!(msg.contains("wide") && msg.contains("float32"), "{msg}");
    assert!(tape.upload_leaf(&t, Some("x"), true).is_err());
    let mut g = GraphBuilder::new();
    let x = g.leaf([2, 2], None).unwrap();
    g.apply(Op::Exp, &[x]).unwrap();
    let replayed = g.finish().replay(&mut tape, &[t], &[]);
    assert!(matches!(replayed, Err(Error::NoWireFormat { .. })));
    // Nothing was recorded or allocated on the way.
    assert!(tape.is_empty());
    assert_eq!(tape.device().memory_usage().alloc_count, 0);
    // The same type cannot be read back from a device buffer either.
    let f = Recorder::<f32>::leaf(&mut tape, Tensor::ones([2]), None, false).unwrap();
    assert!(matches!(
        tape.read::<Wide>(f),
        Err(Error::NoWireFormat { op: "download", .. })
    ));
}

#[test]
fn f32_and_f64_round_trip_through_the_device() {
    let mut dev = SimDevice::new();
    let t32 = Tensor::<f32>::from_fn([3], |i| 0.1 * i as f32);
    let b = AnyBuffer::upload(&mut dev, &t32).unwrap();
    assert_eq!(b.download::<f32, _>(&dev).unwrap(), t32, "f32 is bit-exact");
    let t64 = Tensor::<f64>::from_fn([3], |i| 0.1 * i as f64);
    let b = AnyBuffer::upload(&mut dev, &t64).unwrap();
    let back: Tensor<f64> = b.download(&dev).unwrap();
    for (x, y) in back.data().iter().zip(t64.data()) {
        assert_eq!(
            *x,
            <f64 as From<f32>>::from(*y as f32),
            "f64 is rounded to the nearest f32"
        );
    }
}
