//! Host operations through a real plugin: `HostApiV1::release` frees a tensor before the call
//! returns, and a released handle can no longer be used. The fixture is
//! `tests/plugins/use-after-release` (library `mstest_use_after_release`), a dependency of this
//! crate, so `cargo test` builds it into `target/<profile>/deps` next to this test binary.
//!
//! Handles are numbered per call: with a base and three experts the inputs are handles 1 to 4, so
//! the first tensor the fixture makes, the one it releases, is handle 5.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use mergescope_engine::merge::{MemModel, merge_in_memory};
use mergescope_tests::{assert_contains, load, model};
use serde_json::json;

const FIXTURE: &str = "mstest_use_after_release";
/// The handle of the first tensor made in a call with a base and three experts.
const RELEASED: &str = "handle 5";

/// A base and three experts with a matrix and a bias; the means are exact in f32.
fn inputs() -> (MemModel, Vec<MemModel>) {
    let base = model(&[
        ("layer.bias", &[3], &[9.0, 9.0, 9.0]),
        ("layer.weight", &[2, 3], &[7.0; 6]),
    ]);
    let experts = vec![
        model(&[
            ("layer.bias", &[3], &[0.5, 1.0, -1.0]),
            ("layer.weight", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        ]),
        model(&[
            ("layer.bias", &[3], &[0.5, 0.0, 1.0]),
            ("layer.weight", &[2, 3], &[3.0, -1.0, 0.0, 2.0, 1.0, -2.0]),
        ]),
        model(&[
            ("layer.bias", &[3], &[2.0, -1.0, 3.0]),
            ("layer.weight", &[2, 3], &[-1.0, 2.0, 6.0, 3.0, 3.0, 11.0]),
        ]),
    ];
    (base, experts)
}

/// The message of a merge with `mode` that must fail; checks that it names the plugin and a
/// tensor.
fn failure(mode: &str) -> String {
    let (base, experts) = inputs();
    let err = merge_in_memory(&load(FIXTURE), &json!({ "mode": mode }), 0, Some(&base), &experts)
        .map(|_| ())
        .expect_err("the merge must fail")
        .to_string();
    assert_contains(&err, &["mstest-use-after-release"]);
    assert!(
        err.contains("layer.bias") || err.contains("layer.weight"),
        "the message should name the tensor: {err}"
    );
    err
}

#[test]
fn using_a_released_handle_fails_naming_it() {
    let err = failure("use");
    assert_contains(&err, &["unknown or released tensor handle", RELEASED]);
}

#[test]
fn releasing_twice_fails_naming_the_handle() {
    let err = failure("double");
    assert_contains(&err, &["release", "already released", RELEASED]);
}

#[test]
fn returning_a_released_handle_is_refused() {
    let err = failure("return");
    assert_contains(&err, &[RELEASED, "not a tensor of this call"]);
}

#[test]
fn releasing_inputs_and_intermediates_keeps_the_result_right() {
    let (base, experts) = inputs();
    let plugin = load(FIXTURE);
    // A failed merge leaves nothing behind that breaks the next one on the same plugin.
    failure("use");
    let out = merge_in_memory(&plugin, &json!({ "mode": "ok" }), 0, Some(&base), &experts).expect("merge");
    assert_eq!(out.len(), 2);
    let want: [(&str, &[usize], &[f32]); 2] = [
        ("layer.bias", &[3], &[1.0, 0.0, 1.0]),
        ("layer.weight", &[2, 3], &[1.0, 1.0, 3.0, 3.0, 3.0, 5.0]),
    ];
    for (name, shape, data) in want {
        let t = out.get(name).unwrap_or_else(|| panic!("output has no tensor {name}"));
        assert_eq!(t.shape, shape, "{name}: shape");
        assert!(
            t.data.iter().zip(data).all(|(g, w)| (g - w).abs() <= 1e-6),
            "{name}: got {:?}, want {data:?}",
            t.data
        );
    }
    // Without a base the inputs are handles 1 to 3; releasing them is just as fine.
    let out = merge_in_memory(&plugin, &json!({ "mode": "ok" }), 0, None, &experts).expect("merge without base");
    let bias = &out.get("layer.bias").unwrap().data;
    assert!(
        bias.iter().zip([1.0f32, 0.0, 1.0]).all(|(g, w)| (g - w).abs() <= 1e-6),
        "{bias:?}"
    );
}

/// `bernoulli_mask_p` (extension `mergescope.host.random.v2`, ABI 1.3) through the SDK on a real
/// host call context: a constant probability tensor gives exactly `bernoulli_mask`'s mask (for a
/// probability that f32 holds exactly), a varying one the host's draw for each element, and a
/// probability outside [0, 1] or non-finite fails naming the value.
#[test]
fn bernoulli_mask_p_with_a_constant_probability_is_bernoulli_mask() {
    use mergescope_engine::plugin::call::CallCtx;
    use mergescope_engine::rng::bernoulli_keep;
    use mergescope_plugin_api::Host;
    use std::sync::atomic::AtomicBool;

    let device = candle_core::Device::Cpu;
    let cancel = AtomicBool::new(false);
    let log = |_: u32, _: &str| {};
    let mut ctx = CallCtx::new(&device, &cancel, &log);
    let table = ctx.table();
    // From here on `ctx` is reached only through the table's pointer, as a plugin reaches it.
    // SAFETY: the table of a live context, used on this thread while `ctx` stays put.
    let host = unsafe { Host::from_raw(&table) }.expect("host");
    let n = 5_000usize;
    let like = host.from_f32(&vec![0.0; n], &[50, 100]).unwrap();
    for (p, seed, offset) in [
        (0.25f64, 7u64, 0u64),
        (f64::from(0.3f32), 8, 123),
        (0.0, 9, 0),
        (1.0, 1, 5),
    ] {
        let mask = host
            .read_f32(host.bernoulli_mask(like, p, seed, offset).unwrap())
            .unwrap();
        let probs = host.full_like(like, p).unwrap();
        let mask_p_t = host.bernoulli_mask_p(probs, seed, offset).unwrap();
        assert_eq!(host.shape(mask_p_t).unwrap(), vec![50, 100]);
        let mask_p = host.read_f32(mask_p_t).unwrap();
        assert_eq!(mask, mask_p, "p = {p}, seed {seed}, offset {offset}");
    }
    // A probability per element: element j is kept iff the draw for (seed, offset + j) is below p_j.
    let p: Vec<f32> = (0..n).map(|j| (j % 101) as f32 / 100.0).collect();
    let probs = host.from_f32(&p, &[n]).unwrap();
    let mask = host.read_f32(host.bernoulli_mask_p(probs, 99, 1_000).unwrap()).unwrap();
    for (j, m) in mask.iter().enumerate() {
        assert_eq!(
            *m == 1.0,
            bernoulli_keep(99, 1_000 + j as u64, f64::from(p[j])),
            "element {j}"
        );
    }
    for bad in [1.5f32, -0.25, f32::NAN, f32::INFINITY] {
        let mut values = vec![0.5f32; 10];
        values[3] = bad;
        let probs = host.from_f32(&values, &[10]).unwrap();
        assert!(host.bernoulli_mask_p(probs, 1, 0).is_err(), "{bad} must be refused");
        // SAFETY: the context the table points at; no host call is running.
        let err = unsafe { &mut *table.ctx.cast::<CallCtx<'_>>() }
            .error
            .take()
            .expect("the host keeps the message");
        assert_contains(&err, &["bernoulli_mask_p", &bad.to_string(), "element 3", "[0, 1]"]);
    }
}
