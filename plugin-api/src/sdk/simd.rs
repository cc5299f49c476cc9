//! [`avx2_dispatch!`](crate::avx2_dispatch): hot loops compiled twice: for the baseline x86-64 (SSE2) every build targets, and for AVX2,
//! chosen at run time by what the CPU has. The loops are plain Rust that the compiler
//! vectorises; AVX2 doubles the width of the integer and f32 lanes. Both versions run the same
//! IEEE operations in the same order (AVX2 does not enable FMA, and the compiler never fuses a
//! multiply and an add on its own), so results are bit-identical on every path.

/// Defines a function whose body is compiled for the baseline and for AVX2, and dispatches to
/// the AVX2 build where the CPU has it (`is_x86_feature_detected!` caches its answer). For the
/// hot elementwise loops of the host and of plugins; on other architectures it is the plain
/// function.
///
/// ```
/// mergescope_plugin_api::avx2_dispatch! {
///     /// y ← a·x + y.
///     pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
///         for (yi, xi) in y.iter_mut().zip(x) {
///             *yi += a * xi;
///         }
///     }
/// }
/// let mut y = vec![1.0f32; 5];
/// axpy(2.0, &[1.0, 2.0, 3.0, 4.0, 5.0], &mut y);
/// assert_eq!(y, [3.0, 5.0, 7.0, 9.0, 11.0]);
/// ```
#[macro_export]
macro_rules! avx2_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn generic($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            fn avx2($($arg: $ty),*) $(-> $ret)? {
                generic($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                return unsafe { avx2($($arg),*) };
            }
            generic($($arg),*)
        }
    };
}

#[cfg(test)]
mod tests {
    crate::avx2_dispatch! {
        /// Sum of squares in f32, in index order (a float reduction: order matters).
        fn sum_squares(v: &[f32]) -> f32 {
            v.iter().fold(0.0, |s, x| s + x * x)
        }
    }

    #[test]
    fn both_builds_give_the_same_bits() {
        let v: Vec<f32> = (0..10_001).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.4).collect();
        let sequential = v.iter().fold(0.0f32, |s, x| s + x * x);
        assert_eq!(sum_squares(&v).to_bits(), sequential.to_bits());
    }
}
