//! The small records ranks exchange: a phase's outcome ([`Status`]) and the start-up check of
//! the model's parameters ([`ParamSig`]).

use crate::Result;
use crate::error::usage;

/// The longest error message a rank sends to the others (longer ones are cut, on a character
/// boundary, and end in `…`).
const MAX_MESSAGE: usize = 900;

/// One rank's outcome of a phase.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Status {
    pub ok: bool,
    /// The rank's step count (the ranks must agree).
    pub step: u64,
    /// The error's message when not `ok`.
    pub message: String,
    /// A step's gradient layout: each buffer's length (empty outside a step).
    pub layout: Vec<u64>,
    /// A step's optimizer, as [`optimizer_record`] describes it (empty outside a step).
    pub optimizer: String,
}

impl Status {
    pub(crate) fn of<R>(step: u64, r: &Result<R>, layout: &[u64], optimizer: &str) -> Status {
        let message = match r {
            Ok(_) => String::new(),
            Err(e) => cut(&e.to_string()),
        };
        Status {
            ok: r.is_ok(),
            step,
            message,
            layout: layout.to_vec(),
            optimizer: optimizer.to_owned(),
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            25 + 8 * self.layout.len() + self.optimizer.len() + self.message.len(),
        );
        out.push(u8::from(self.ok));
        out.extend_from_slice(&self.step.to_le_bytes());
        out.extend_from_slice(&(self.layout.len() as u64).to_le_bytes());
        for l in &self.layout {
            out.extend_from_slice(&l.to_le_bytes());
        }
        out.extend_from_slice(&(self.optimizer.len() as u64).to_le_bytes());
        out.extend_from_slice(self.optimizer.as_bytes());
        out.extend_from_slice(self.message.as_bytes());
        out
    }

    fn decode(b: &[u8]) -> Option<Status> {
        let (&ok, rest) = b.split_first()?;
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                rest.get(8 * i..8 * i + 8)?.try_into().ok()?,
            ))
        };
        let step = word(0)?;
        let n = usize::try_from(word(1)?).ok()?;
        if n > rest.len() / 8 {
            return None;
        }
        let layout = (0..n).map(|i| word(2 + i)).collect::<Option<Vec<u64>>>()?;
        let o = usize::try_from(word(2 + n)?).ok()?;
        let text = rest.get(8 * (3 + n)..)?;
        if o > text.len() {
            return None;
        }
        let (optimizer, message) = text.split_at(o);
        Some(Status {
            ok: ok == 1,
            step,
            message: String::from_utf8_lossy(message).into_owned(),
            layout,
            optimizer: String::from_utf8(optimizer.to_vec()).ok()?,
        })
    }
}

/// `s` cut to [`MAX_MESSAGE`] bytes.
fn cut(s: &str) -> String {
    if s.len() <= MAX_MESSAGE {
        return s.to_string();
    }
    let mut end = MAX_MESSAGE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Every rank's [`Status`]; records that do not decode, or ranks at different steps, are an
/// error naming the rank.
pub(crate) fn decode_all(what: &'static str, all: &[Vec<u8>]) -> Result<Vec<Status>> {
    let mut out = Vec::with_capacity(all.len());
    for (rank, b) in all.iter().enumerate() {
        let s = Status::decode(b).ok_or_else(|| {
            usage(
                what,
                format!("rank {rank} sent a status record of {} bytes that does not decode (ranks running different programs?)", b.len()),
            )
        })?;
        out.push(s);
    }
    if let Some((rank, s)) = out.iter().enumerate().find(|(_, s)| s.step != out[0].step) {
        return Err(usage(
            what,
            format!(
                "the ranks are at different steps: rank 0 at step {}, rank {rank} at step {} (every rank must call step, save and load the same number of times, in the same order)",
                out[0].step, s.step
            ),
        ));
    }
    Ok(out)
}

/// The optimizer of a data-parallel step as the ranks compare it: the rule and its
/// hyper-parameters, the schedule, the clipping, the finite checks and the steps done, and at
/// the group's first step (`state`) a hash of its state for the session's parameters (the
/// moments of an optimizer stepped before the group began differ between ranks that stepped
/// apart, and rank 0's parameters are all `data_parallel` copies). Every rank must step the
/// same optimizer: a rate that differs between ranks makes the replicas drift apart.
pub(crate) fn optimizer_record<O: tl_session::Train>(
    session: &O,
    opt: &tl_session::Optimizer,
    state: bool,
) -> String {
    use std::fmt::Write;
    let mut s = opt.name().to_owned();
    for (name, v) in opt.hyper_parameters() {
        let _ = write!(s, " {name} {v}");
    }
    let _ = write!(
        s,
        ", schedule {:?}, clipping {:?}, finite check {}, stop on a non-finite loss {}, {} step(s) done",
        opt.lr_schedule(),
        opt.clipping(),
        opt.checks_finite(),
        opt.stops_on_non_finite_loss(),
        opt.steps_done()
    );
    if state {
        match session.optimizer_state(opt) {
            Ok(dict) => {
                // FNV-1a over the names and the values' bits.
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                let mut eat = |bytes: &[u8]| {
                    for &b in bytes {
                        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                    }
                };
                for (name, t) in &dict {
                    eat(name.as_bytes());
                    for v in t.data() {
                        eat(&v.to_bits().to_le_bytes());
                    }
                }
                let _ = write!(s, ", state {h:016x}");
            }
            Err(e) => {
                let _ = write!(s, ", state not exported ({e})");
            }
        }
    }
    s
}

/// Every rank's step optimizer ([`optimizer_record`]) equal to rank 0's, else an error naming
/// the first rank that differs and both records.
pub(crate) fn check_optimizers(what: &'static str, all: &[Status]) -> Result<()> {
    let first = &all[0].optimizer;
    match all.iter().enumerate().find(|(_, s)| s.optimizer != *first) {
        None => Ok(()),
        Some((rank, s)) => Err(usage(
            what,
            format!(
                "the ranks' optimizers differ at step {}: rank 0's is `{first}`, rank {rank}'s is `{}` (every rank must build the same optimizer, load the same state and step it only through the group)",
                s.step, s.optimizer
            ),
        )),
    }
}

/// One parameter as the start-up check compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParamSig {
    pub name: String,
    pub dims: Vec<usize>,
    pub trainable: bool,
}

impl std::fmt::Display for ParamSig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} of shape {:?}", self.name, self.dims)?;
        if !self.trainable {
            f.write_str(" (frozen)")?;
        }
        Ok(())
    }
}

/// A rank's world size, element type and parameter list as text, one line each.
pub(crate) fn encode_sigs(world: usize, dtype: &str, sigs: &[ParamSig]) -> Vec<u8> {
    let mut s = format!("{world}\n{dtype}\n");
    for p in sigs {
        let dims: Vec<String> = p.dims.iter().map(usize::to_string).collect();
        s.push_str(&format!(
            "{}\t{}\t{}\n",
            p.name,
            dims.join(","),
            u8::from(p.trainable)
        ));
    }
    s.into_bytes()
}

struct Sigs {
    world: String,
    dtype: String,
    params: Vec<ParamSig>,
}

fn decode_sigs(b: &[u8]) -> Option<Sigs> {
    let text = std::str::from_utf8(b).ok()?;
    let mut lines = text.lines();
    let world = lines.next()?.to_string();
    let dtype = lines.next()?.to_string();
    let mut params = Vec::new();
    for line in lines {
        let mut f = line.split('\t');
        let name = f.next()?.to_string();
        let dims_s = f.next()?;
        let dims = if dims_s.is_empty() {
            Vec::new()
        } else {
            dims_s
                .split(',')
                .map(|d| d.parse().ok())
                .collect::<Option<Vec<usize>>>()?
        };
        let trainable = f.next()? == "1";
        params.push(ParamSig {
            name,
            dims,
            trainable,
        });
    }
    Some(Sigs {
        world,
        dtype,
        params,
    })
}

/// Every rank's parameter list equal to rank 0's, else an error naming the first parameter
/// that differs (or the world sizes / element types that do).
pub(crate) fn check_sigs(me: usize, all: &[Vec<u8>]) -> Result<()> {
    const WHAT: &str = "Runtime::data_parallel";
    let decoded: Vec<Sigs> = all
        .iter()
        .enumerate()
        .map(|(rank, b)| {
            decode_sigs(b).ok_or_else(|| {
                usage(WHAT, format!("rank {rank}'s parameter list does not decode (ranks running different programs?)"))
            })
        })
        .collect::<Result<_>>()?;
    let first = &decoded[0];
    for (rank, d) in decoded.iter().enumerate().skip(1) {
        let at = format!("(this is rank {me})");
        if d.world != first.world {
            return Err(usage(
                WHAT,
                format!(
                    "the ranks disagree on the world size: rank 0 counts {}, rank {rank} counts {} {at}",
                    first.world, d.world
                ),
            ));
        }
        if d.dtype != first.dtype {
            return Err(usage(
                WHAT,
                format!(
                    "the ranks disagree on the element type: rank 0 trains {}, rank {rank} trains {} {at}",
                    first.dtype, d.dtype
                ),
            ));
        }
        let n = first.params.len().max(d.params.len());
        for i in 0..n {
            match (first.params.get(i), d.params.get(i)) {
                (Some(a), Some(b)) if a == b => {}
                (a, b) => {
                    let show = |p: Option<&ParamSig>| {
                        p.map_or_else(
                            || "nothing (its list ends there)".to_string(),
                            ToString::to_string,
                        )
                    };
                    return Err(usage(
                        WHAT,
                        format!(
                            "the ranks' models differ at parameter {i}: rank 0 has {}, rank {rank} has {} ({} vs {} parameters) {at}",
                            show(a),
                            show(b),
                            first.params.len(),
                            d.params.len()
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(name: &str, dims: &[usize]) -> ParamSig {
        ParamSig {
            name: name.into(),
            dims: dims.to_vec(),
            trainable: true,
        }
    }

    #[test]
    fn status_round_trips_and_long_messages_are_cut() {
        let s = Status {
            ok: false,
            step: 7,
            message: "é".repeat(1000),
            layout: vec![3, 0, 12],
            optimizer: "adamw lr 0.001 ü".into(),
        };
        let d = Status::decode(&s.encode()).unwrap();
        assert_eq!(d, s);
        // Cut anywhere, a record does not decode (never a panic).
        let b = s.encode();
        for n in 0..1 + 8 + 8 + 8 * 3 + 8 + s.optimizer.len() {
            assert!(Status::decode(&b[..n]).is_none(), "{n}");
        }
        let e: Result<()> = Err(usage("x", "é".repeat(1000)));
        let cut = Status::of(3, &e, &[], "");
        assert!(
            cut.message.len() <= MAX_MESSAGE + "…".len(),
            "{}",
            cut.message.len()
        );
        assert!(cut.message.ends_with('…'));
    }

    #[test]
    fn ranks_at_different_steps_are_an_error_naming_them() {
        let at = |step| Status {
            ok: true,
            step,
            message: String::new(),
            layout: Vec::new(),
            optimizer: String::new(),
        };
        let (a, b) = (at(4).encode(), at(5).encode());
        let e = decode_all("t", &[a.clone(), a.clone(), b])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 2 at step 5") && e.contains("rank 0 at step 4"),
            "{e}"
        );
        assert!(
            decode_all("t", &[vec![1, 2]])
                .unwrap_err()
                .to_string()
                .contains("rank 0")
        );
    }

    #[test]
    fn the_first_differing_parameter_is_named() {
        let a = encode_sigs(
            2,
            "f32",
            &[sig("fc1.weight", &[32, 64]), sig("fc2.weight", &[10, 32])],
        );
        let b = encode_sigs(
            2,
            "f32",
            &[sig("fc1.weight", &[32, 64]), sig("fc2.weight", &[10, 16])],
        );
        check_sigs(0, &[a.clone(), a.clone()]).unwrap();
        let e = check_sigs(1, &[a.clone(), b]).unwrap_err().to_string();
        assert!(
            e.contains("parameter 1")
                && e.contains("[10, 16]")
                && e.contains("[10, 32]")
                && e.contains("\"fc2.weight\""),
            "{e}"
        );
        let short = encode_sigs(2, "f32", &[sig("fc1.weight", &[32, 64])]);
        let e = check_sigs(0, &[a.clone(), short]).unwrap_err().to_string();
        assert!(
            e.contains("nothing (its list ends there)") && e.contains("2 vs 1"),
            "{e}"
        );
        let renamed = encode_sigs(
            2,
            "f32",
            &[sig("fc1.w", &[32, 64]), sig("fc2.weight", &[10, 32])],
        );
        let e = check_sigs(0, &[a.clone(), renamed])
            .unwrap_err()
            .to_string();
        assert!(e.contains("parameter 0") && e.contains("\"fc1.w\""), "{e}");
        let world = encode_sigs(
            3,
            "f32",
            &[sig("fc1.weight", &[32, 64]), sig("fc2.weight", &[10, 32])],
        );
        let e = check_sigs(0, &[a.clone(), world]).unwrap_err().to_string();
        assert!(
            e.contains("world size") && e.contains("rank 1 counts 3"),
            "{e}"
        );
        let dtype = encode_sigs(
            2,
            "f64",
            &[sig("fc1.weight", &[32, 64]), sig("fc2.weight", &[10, 32])],
        );
        let e = check_sigs(0, &[a, dtype]).unwrap_err().to_string();
        assert!(e.contains("element type") && e.contains("f64"), "{e}");
    }
}
