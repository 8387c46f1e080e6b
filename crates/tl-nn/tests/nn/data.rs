//! Data: the `DataLoader` over any `Dataset` (each index once per epoch, drop-last, seeded
//! shuffles that differ per epoch, collates, errors), the digits split as a `Dataset`, token
//! windows and the vocabulary, the user RNG, and sampling the next token.

use std::collections::BTreeSet;

use tl_nn::data::{
    self, Classify, DataLoader, Dataset, Stack, TokenWindows, Vocab, kjv_text, unigram_nll,
};
use tl_nn::{Result, Rng, argmax, sample};
use tl_spec::Tensor;

/// A dataset of `n` examples whose example `i` is `i` (and an error past the end).
struct Count(usize);

impl Dataset for Count {
    type Item = usize;
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, i: usize) -> Result<usize> {
        data::check_index("Count::get", i, self.0)?;
        Ok(i)
    }
}

/// The batches of one epoch, collated as plain index lists.
fn epoch(n: usize, batch: usize, shuffle: Option<u64>, drop_last: bool, e: u64) -> Vec<Vec<usize>> {
    let ds = Count(n);
    let mut loader = DataLoader::new(&ds, batch, |v: Vec<usize>| Ok(v))
        .unwrap()
        .drop_last(drop_last);
    if let Some(seed) = shuffle {
        loader = loader.shuffle(seed);
    }
    let batches: Vec<Vec<usize>> = loader.epoch(e).map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), loader.len(), "len() counts the batches");
    batches
}

#[test]
fn loader_visits_each_index_once_per_epoch() {
    for (n, b) in [(10, 3), (9, 3), (1, 5), (100, 7), (0, 4)] {
        for shuffle in [None, Some(1)] {
            let batches = epoch(n, b, shuffle, false, 2);
            assert_eq!(batches.len(), n.div_ceil(b));
            let all: Vec<usize> = batches.concat();
            assert_eq!(all.len(), n, "n {n}, batch {b}");
            assert_eq!(all.iter().copied().collect::<BTreeSet<_>>().len(), n);
            assert!(batches.iter().rev().skip(1).all(|x| x.len() == b));
            if shuffle.is_none() {
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "unshuffled is in order");
            }
        }
    }
}

#[test]
fn drop_last_leaves_out_only_the_short_batch() {
    let kept = epoch(10, 3, Some(4), true, 0);
    assert_eq!(kept.len(), 3);
    assert!(kept.iter().all(|b| b.len() == 3));
    let full = epoch(10, 3, Some(4), false, 0);
    assert_eq!(&full[..3], &kept[..], "the same order, one batch less");
    assert_eq!(full[3].len(), 1);
    // Nothing to drop when the batch size divides the data; fewer examples than one batch
    // leave nothing.
    assert_eq!(epoch(9, 3, None, true, 0).len(), 3);
    assert!(epoch(2, 3, None, true, 0).is_empty());
}

#[test]
fn shuffles_are_reproducible_per_seed_and_differ_per_epoch_and_seed() {
    let a = epoch(50, 8, Some(7), false, 0);
    assert_eq!(a, epoch(50, 8, Some(7), false, 0), "same seed and epoch");
    assert_ne!(a, epoch(50, 8, Some(7), false, 1), "another epoch");
    assert_ne!(a, epoch(50, 8, Some(8), false, 0), "another seed");
    assert_ne!(a.concat(), (0..50).collect::<Vec<_>>(), "shuffled");
    // Epoch e's order is stream e of the seed.
    let order = Rng::stream(7, 0).permutation(50).unwrap();
    assert_eq!(a.concat(), order);
}

#[test]
fn loader_errors_name_the_value() {
    let ds = Count(3);
    let e = DataLoader::new(&ds, 0, |v: Vec<usize>| Ok(v))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("DataLoader::new") && e.contains("got 0"), "{e}");
    let e = ds.get(3).unwrap_err().to_string();
    assert!(e.contains("index 3") && e.contains("3 example"), "{e}");
    // A failing collate is that batch's error; the iterator goes on.
    let loader = DataLoader::new(&ds, 2, |v: Vec<usize>| match v.contains(&2) {
        true => Err(tl_nn::Error::Usage {
            what: "collate",
            detail: "no 2".into(),
        }),
        false => Ok(v),
    })
    .unwrap();
    let r: Vec<_> = loader.epoch(0).collect();
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].as_ref().unwrap(), &vec![0, 1]);
    assert!(r[1].as_ref().unwrap_err().to_string().contains("no 2"));
}

/// A 0-d tensor has no leading (sample) axis: it is no dataset, and a loader over it, its
/// `get` and its `check` are errors saying so (not a dataset of no examples); a 1-d tensor is
/// a dataset of its scalars.
#[test]
fn a_0d_tensor_is_refused_as_a_dataset() {
    let x = Tensor::<f64>::scalar(3.0);
    let e = DataLoader::new(&x, 1, Stack).unwrap_err().to_string();
    assert_eq!(
        e,
        "Dataset::check (Tensor): a 0-d tensor (shape []) is no dataset: a dataset needs a leading (sample) axis, one example per index along it; give one example as a dataset of one (x.reshape([1]))"
    );
    let e = Dataset::get(&x, 0).unwrap_err().to_string();
    assert!(
        e.starts_with("Dataset::get (Tensor): a 0-d tensor") && e.contains("leading (sample) axis"),
        "{e}"
    );
    assert!(Dataset::check(&x).is_err());
    // One example as a dataset of one, and a vector as a dataset of scalars.
    let one = x.reshape([1]).unwrap();
    Dataset::check(&one).unwrap();
    let b: Vec<Tensor<f64>> = DataLoader::new(&one, 4, Stack)
        .unwrap()
        .epoch(0)
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(
        (b.len(), b[0].shape().dims(), b[0].data()),
        (1, &[1][..], &[3.0][..])
    );
    // The other datasets keep the default check.
    Dataset::check(&Count(0)).unwrap();
    Dataset::check(&[1, 2][..]).unwrap();
}

#[test]
fn stack_and_classify_collate_tensors_and_labels() {
    let x = Tensor::<f64>::new([4, 2, 3], (0..24).map(f64::from).collect()).unwrap();
    assert_eq!(Dataset::len(&x), 4);
    assert_eq!(
        Dataset::get(&x, 2).unwrap().data(),
        &(12..18).map(f64::from).collect::<Vec<_>>()[..]
    );
    let e = Dataset::get(&x, 4).unwrap_err().to_string();
    assert!(e.contains("index 4") && e.contains("4 example"), "{e}");
    // Stacking the rows back in order gives the tensor.
    let b: Vec<Tensor<f64>> = DataLoader::new(&x, 3, Stack)
        .unwrap()
        .epoch(0)
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(b[0].shape().dims(), [3, 2, 3]);
    assert_eq!(b[1].shape().dims(), [1, 2, 3]);
    assert_eq!([b[0].data(), b[1].data()].concat(), x.data());
    let e = data::stack(&[Dataset::get(&x, 0).unwrap(), Tensor::<f64>::zeros([3])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("item 1 has shape"), "{e}");
    // Classify: features stacked, labels checked against the classes.
    let pairs = [
        (Tensor::<f32>::vector(vec![1.0]), 1),
        (Tensor::vector(vec![2.0]), 0),
    ];
    let (f, l) = DataLoader::new(&pairs[..], 2, Classify { classes: 2 })
        .unwrap()
        .epoch(0)
        .next()
        .unwrap()
        .unwrap();
    assert_eq!((f.data(), l.values()), (&[1.0f32, 2.0][..], &[1, 0][..]));
    let bad = DataLoader::new(&pairs[..], 2, Classify { classes: 1 }).unwrap();
    let e = bad.epoch(0).next().unwrap().unwrap_err().to_string();
    assert!(e.contains("label 1 at position 0"), "{e}");
}

#[test]
fn the_digits_split_is_a_dataset_and_batches_is_its_loader() {
    let (_, test) = data::digits().unwrap();
    let images = test.clone().shaped(&[1, 8, 8]).unwrap();
    let (x, y) = images.get(5).unwrap();
    assert_eq!(x.shape().dims(), [1, 8, 8]);
    assert_eq!((x.data(), y), (&test.x()[5 * 64..6 * 64], test.y()[5]));
    let e = test.get(360).unwrap_err().to_string();
    assert!(e.contains("Split::get") && e.contains("index 360"), "{e}");
    let loader = DataLoader::new(&test, 64, Classify { classes: 10 })
        .unwrap()
        .shuffle(3);
    let via_loader: Vec<_> = loader.epoch(0).map(|b| b.unwrap()).collect();
    assert_eq!(via_loader, test.batches::<f32>(64, 10, 3).unwrap());
    // Every image once: the batches hold the split's pixels, permuted.
    let bits = |r: &[f32]| r.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let mut seen: Vec<Vec<u32>> = via_loader
        .iter()
        .flat_map(|(x, _)| x.data().chunks(64).map(bits).collect::<Vec<_>>())
        .collect();
    let mut want: Vec<Vec<u32>> = test.x().chunks(64).map(bits).collect();
    seen.sort_unstable();
    want.sort_unstable();
    assert_eq!(seen, want);
}

#[test]
fn vocab_encodes_and_decodes_the_shipped_text() {
    let text = kjv_text();
    let vocab = Vocab::from_text(text).unwrap();
    assert_eq!(
        vocab.len(),
        72,
        "data/README.md says 72 distinct characters"
    );
    assert!(vocab.chars().windows(2).all(|w| w[0] < w[1]));
    let ids = vocab.encode(&text[..200]).unwrap();
    assert_eq!(vocab.decode(&ids).unwrap(), &text[..200]);
    assert!(text.starts_with("Genesis"));
    let e = vocab.encode("in the béginning").unwrap_err().to_string();
    assert!(e.contains("'é' at position 8"), "{e}");
    let e = vocab.decode(&[0, 72]).unwrap_err().to_string();
    assert!(
        e.contains("token 72 at position 1") && e.contains("72"),
        "{e}"
    );
    assert!(Vocab::from_text("").is_err());
}

#[test]
fn token_windows_batch_inputs_and_next_token_targets() {
    let tokens: Vec<usize> = (0..20).map(|i| i % 7).collect();
    let w = TokenWindows::new(tokens.clone(), 4, 7).unwrap();
    let b = w.batch_at(&[0, 15]).unwrap();
    assert_eq!(b.dims(), [2, 4]);
    assert_eq!(b.inputs, [&tokens[0..4], &tokens[15..19]].concat());
    assert_eq!(
        b.targets.values(),
        [&tokens[1..5], &tokens[16..20]].concat()
    );
    assert_eq!(b.targets.classes(), 7);
    let e = w.batch_at(&[16]).unwrap_err().to_string();
    assert!(
        e.contains("start 16") && e.contains("last window start 15"),
        "{e}"
    );

    // Random windows: seeded, every start reachable, each window a slice of the stream.
    let mut r = Rng::new(3);
    let s = w.sample(400, &mut r).unwrap();
    assert_eq!(s, w.sample(400, &mut Rng::new(3)).unwrap());
    assert_ne!(s, w.sample(400, &mut r).unwrap());
    let starts: BTreeSet<usize> = s
        .inputs
        .chunks(4)
        .map(|x| (0..=15).find(|&st| tokens[st..st + 4] == *x).unwrap())
        .collect();
    // Starts 0..=15 cover 7 distinct windows (the stream repeats every 7).
    assert_eq!(starts.len(), 7);

    // As a dataset: consecutive windows, every complete one.
    assert_eq!(Dataset::len(&w), 19 / 4);
    let all: Vec<_> = w.loader(3).unwrap().epoch(0).map(|b| b.unwrap()).collect();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].inputs, tokens[0..12]);
    assert_eq!(all[1].inputs, tokens[12..16]);
    assert_eq!(all[1].targets.values(), &tokens[13..17]);

    for (r, want) in [
        (
            TokenWindows::new(tokens.clone(), 0, 7),
            "context must be at least 1",
        ),
        (
            TokenWindows::new(vec![1; 4], 4, 7),
            "4 token(s) hold no window of context 4",
        ),
        (
            TokenWindows::new(vec![1, 9, 2], 1, 7),
            "token 9 at position 1",
        ),
    ] {
        let e = r.unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    assert!(
        w.sample(0, &mut r)
            .unwrap_err()
            .to_string()
            .contains("got 0")
    );
}

#[test]
fn unigram_baseline_by_hand() {
    // Train 0 0 0 1 over 2 tokens: add-one counts 4, 2, so p = 2/3, 1/3.
    let l = unigram_nll(&[0, 0, 0, 1], &[1, 0], 2).unwrap();
    let want = (-(1.0f64 / 3.0).ln() - (2.0f64 / 3.0).ln()) / 2.0;
    assert!((l - want).abs() < 1e-12, "{l} vs {want}");
    assert!(unigram_nll(&[0], &[], 2).is_err());
    let e = unigram_nll(&[0], &[2], 2).unwrap_err().to_string();
    assert!(e.contains("eval token 2 at position 0"), "{e}");
}

#[test]
fn rng_is_reproducible_and_its_statistics_are_sane() {
    let draw = |seed| {
        let mut r = Rng::new(seed);
        (0..8).map(|_| r.next_u64()).collect::<Vec<_>>()
    };
    assert_eq!(draw(1), draw(1));
    assert_ne!(draw(1), draw(2));
    assert_ne!(Rng::stream(1, 0).next_u64(), Rng::stream(1, 1).next_u64());
    // Resuming from the counter continues the stream exactly.
    let mut r = Rng::new(9);
    r.uniform();
    let mut resumed = Rng::new(9);
    resumed.set_counter(r.counter());
    assert_eq!(r.next_u64(), resumed.next_u64());

    let n = 40_000;
    let mut r = Rng::new(11);
    let u: Vec<f64> = (0..n).map(|_| r.uniform()).collect();
    assert!(u.iter().all(|v| (0.0..1.0).contains(v)));
    let mean = u.iter().sum::<f64>() / n as f64;
    // Standard error √(1/12n) ≈ 0.0014.
    assert!((mean - 0.5).abs() < 0.01, "uniform mean {mean}");
    let z: Vec<f64> = (0..n).map(|_| r.normal()).collect();
    let zm = z.iter().sum::<f64>() / n as f64;
    let zv = z.iter().map(|v| (v - zm).powi(2)).sum::<f64>() / n as f64;
    assert!(
        zm.abs() < 0.03 && (zv - 1.0).abs() < 0.05,
        "normal mean {zm} var {zv}"
    );
    // below(6): each face about n/6 (standard error ≈ 75).
    let mut faces = [0usize; 6];
    for _ in 0..n {
        faces[r.below(6).unwrap()] += 1;
    }
    assert!(faces.iter().all(|&c| c.abs_diff(n / 6) < 450), "{faces:?}");
    assert!(r.below(0).unwrap_err().to_string().contains("Rng::below"));
    // Shuffles: a permutation; each of the 6 orders of 3 items about equally often.
    let mut p = r.permutation(100).unwrap();
    assert_ne!(p, (0..100).collect::<Vec<_>>());
    p.sort_unstable();
    assert_eq!(p, (0..100).collect::<Vec<_>>());
    let mut orders = std::collections::BTreeMap::new();
    for _ in 0..6000 {
        let mut v = ['a', 'b', 'c'];
        r.shuffle(&mut v);
        *orders.entry(v).or_insert(0usize) += 1;
    }
    assert_eq!(orders.len(), 6);
    assert!(
        orders.values().all(|&c| c.abs_diff(1000) < 150),
        "{orders:?}"
    );
}

/// Logits (B, n, V): each row a random permutation of 0, 0.25, …, so the top token of every
/// row leads the next by 0.25.
fn logits(b: usize, n: usize, v: usize, salt: u64) -> Tensor<f32> {
    let mut r = Rng::new(salt);
    let rows: Vec<f32> = (0..b * n)
        .flat_map(|_| r.permutation(v).unwrap())
        .map(|p| p as f32 * 0.25)
        .collect();
    Tensor::new([b, n, v], rows).unwrap()
}

#[test]
fn argmax_reads_the_last_position() {
    let x = logits(3, 5, 11, 1);
    let got = argmax(&x).unwrap();
    for (b, &t) in got.iter().enumerate() {
        let row = &x.data()[(b * 5 + 4) * 11..(b * 5 + 5) * 11];
        assert!(row.iter().all(|&v| v <= row[t]), "row {b}");
    }
    // (B, V) and (V): every row is a last position; ties go to the lowest token.
    let flat = Tensor::<f64>::new([2, 3], vec![1.0, 5.0, 5.0, 0.0, -1.0, 0.0]).unwrap();
    assert_eq!(argmax(&flat).unwrap(), [1, 0]);
    assert_eq!(argmax(&Tensor::<f64>::vector(vec![0.0, 2.0])).unwrap(), [1]);
    let e = argmax(&Tensor::<f32>::zeros([1, 1, 1, 2]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("(B, n, V)") && e.contains("[1, 1, 1, 2]"), "{e}");
    let e = argmax(&Tensor::<f64>::vector(vec![0.0, f64::NAN]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("logit 1 of row 0 is NaN"), "{e}");
}

#[test]
fn sample_with_top_k_one_or_a_small_temperature_is_argmax() {
    let x = logits(16, 3, 20, 5);
    let greedy = argmax(&x).unwrap();
    let mut r = Rng::new(0);
    for _ in 0..5 {
        assert_eq!(sample(&x, 1.0, 1, &mut r).unwrap(), greedy, "top_k = 1");
        assert_eq!(
            sample(&x, 1e-2, 20, &mut r).unwrap(),
            greedy,
            "temperature → 0"
        );
    }
    // At temperature 1 the draws differ from the greedy choice somewhere.
    assert_ne!(sample(&x, 1.0, 20, &mut r).unwrap(), greedy);
    // Reproducible per seed.
    let a = sample(&x, 0.8, 5, &mut Rng::new(4)).unwrap();
    assert_eq!(a, sample(&x, 0.8, 5, &mut Rng::new(4)).unwrap());
    // Ties in every row after the first, ordered otherwise by the row before: each row's cut
    // starts from token order (the lower token first), so top_k = 1 is still argmax, and a
    // cut of 2 through a row of equal logits keeps tokens 0 and 1.
    let ties =
        Tensor::<f64>::new([3, 4], vec![0., 0., 1., 2., 5., 5., 5., 5., 3., 7., 7., 1.]).unwrap();
    assert_eq!(argmax(&ties).unwrap(), [3, 0, 1]);
    assert_eq!(sample(&ties, 1.0, 1, &mut r).unwrap(), [3, 0, 1]);
    let row1 = Tensor::<f64>::new([2, 4], vec![0., 0., 1., 2., 5., 5., 5., 5.]).unwrap();
    let mut seen = [false; 4];
    for _ in 0..200 {
        seen[sample(&row1, 1.0, 2, &mut r).unwrap()[1]] = true;
    }
    assert_eq!(seen, [true, true, false, false]);
}

#[test]
fn sample_follows_the_softmax_of_the_kept_tokens() {
    // Logits ln 1, ln 2, ln 3, ln 4: softmax 0.1, 0.2, 0.3, 0.4; top_k 2 keeps tokens 3 and 2
    // with 4/7, 3/7; temperature 2 flattens to √ weights.
    let x = Tensor::<f64>::vector((1..=4).map(|v| f64::from(v).ln()).collect());
    let freq = |t: f64, k: usize| {
        let mut r = Rng::new(1);
        let mut c = [0usize; 4];
        for _ in 0..20_000 {
            c[sample(&x, t, k, &mut r).unwrap()[0]] += 1;
        }
        c.map(|v| v as f64 / 20_000.0)
    };
    let close =
        |got: [f64; 4], want: [f64; 4]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 0.015);
    let f = freq(1.0, 4);
    assert!(close(f, [0.1, 0.2, 0.3, 0.4]), "{f:?}");
    let f = freq(1.0, 2);
    assert!(close(f, [0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]), "{f:?}");
    let s: f64 = (1..=4).map(|v| f64::from(v).sqrt()).sum();
    let f = freq(2.0, 10);
    let want = [1.0f64, 2.0, 3.0, 4.0].map(|v| v.sqrt() / s);
    assert!(close(f, want), "{f:?} vs {want:?}");
    let mut r = Rng::new(0);
    for (t, k, want) in [
        (1.0, 0, "top_k must be at least 1"),
        (0.0, 1, "temperature must be positive"),
        (-1.0, 1, "got -1"),
        (f64::NAN, 1, "got NaN"),
    ] {
        let e = sample(&x, t, k, &mut r).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("sample"), "{e}");
    }
    // An infinite logit takes every draw.
    let inf = Tensor::<f64>::vector(vec![0.0, f64::INFINITY, 1.0]);
    assert!((0..50).all(|_| sample(&inf, 1.0, 3, &mut r).unwrap() == [1]));
}
