//! Which vector instructions the CPU kernels use: chosen once at run time from what the
//! CPU has, or forced with `NOBUBBLE_SIMD` (`auto`, `avx512`, `avx2`, `portable`).
//!
//! Why at run time: one binary must run at the machine's limit on an AVX-512 server and
//! still run (fast) on an AVX2-only laptop, so nothing is decided at compile time. Why a
//! switch: to measure what AVX-512 buys on a given machine, and to check the dispatch, the
//! AVX2 path must be reachable on an AVX-512 CPU too.
//!
//! Results: the elementwise kernels give the same bits at every level (same IEEE operations
//! per element, in the same order), but the matrix products do not — the AVX-512 and AVX2
//! GEMM kernels block the reduction differently, so their results differ in the last bits.
//! Every rank of a run uses the same level, so schedules stay bit-identical to each other.

use std::fmt;
use std::sync::OnceLock;

use crate::error::{NnError, Result};

/// The environment variable that forces a level.
pub const ENV_VAR: &str = "NOBUBBLE_SIMD";

/// A vector instruction level of the CPU kernels, widest first.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Simd {
    /// AVX-512 (F, VL, BW, DQ): 16 f32 lanes; `gemm`'s `x86-v4` kernels.
    Avx512,
    /// AVX2 with FMA: 8 f32 lanes; `gemm`'s `fma` kernels.
    Avx2,
    /// No run-time-selected vector extension: what the compiler's baseline target gives
    /// (SSE2 on x86-64, NEON on aarch64). On x86-64 `gemm` runs its scalar kernel; elsewhere
    /// it picks its own.
    Portable,
}

impl Simd {
    /// Every level, widest first.
    pub const ALL: [Simd; 3] = [Simd::Avx512, Simd::Avx2, Simd::Portable];

    /// The widest level this CPU supports: a level counts only if `gemm`'s kernels for
    /// it can run (its `V3`/`V4` feature sets, which include what the elementwise builds
    /// enable), so a VM that hides one flag gets a narrower level, not a crash.
    pub fn detected() -> Simd {
        static DETECTED: OnceLock<Simd> = OnceLock::new();
        *DETECTED.get_or_init(Simd::detect)
    }

    fn detect() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            use gemm_common::simd::{MixedSimd, V3, V4};
            let v3 = <V3 as MixedSimd<f32, f32, f32, f32>>::try_new().is_some();
            let v4 = <V4 as MixedSimd<f32, f32, f32, f32>>::try_new().is_some();
            if v3 && v4 {
                return Simd::Avx512;
            }
            if v3 {
                return Simd::Avx2;
            }
        }
        Simd::Portable
    }

    /// Whether this CPU can run kernels of this level.
    pub fn is_supported(self) -> bool {
        self <= Simd::Portable && self >= Simd::detected()
    }

    /// The level every backend uses unless told otherwise: `NOBUBBLE_SIMD` if set (and
    /// valid for this CPU), else the detected one. Resolved once per process;
    /// [`Simd::from_env`] reports a bad setting as an error (the CLI checks it at start).
    pub fn selected() -> Simd {
        static SELECTED: OnceLock<Simd> = OnceLock::new();
        *SELECTED.get_or_init(|| Simd::from_env().unwrap_or_else(|_| Simd::detected()))
    }

    /// `NOBUBBLE_SIMD` read and checked against this CPU (`auto` or unset: the detected
    /// level).
    pub fn from_env() -> Result<Simd> {
        match std::env::var(ENV_VAR) {
            Ok(value) => Simd::level(&value).map_err(|why| {
                NnError::Config(format!("{ENV_VAR}={value}: {why}; or unset {ENV_VAR}"))
            }),
            Err(std::env::VarError::NotPresent) => Ok(Simd::detected()),
            Err(std::env::VarError::NotUnicode(_)) => Err(NnError::Config(format!(
                "{ENV_VAR} is not valid UTF-8; set it to auto, avx512, avx2 or portable"
            ))),
        }
    }

    /// Parses a level name (`auto` is the detected level) and checks that this CPU has it.
    pub fn parse(value: &str) -> Result<Simd> {
        Simd::level(value).map_err(NnError::Config)
    }

    /// This level, or an error saying this CPU lacks it.
    pub fn require(self) -> Result<Simd> {
        self.unsupported()
            .map_or(Ok(self), |why| Err(NnError::Config(why)))
    }

    /// [`Simd::parse`] with the bare reason as the error.
    fn level(value: &str) -> std::result::Result<Simd, String> {
        let simd = match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => return Ok(Simd::detected()),
            "avx512" | "avx-512" | "x86-v4" => Simd::Avx512,
            "avx2" | "fma" | "x86-v3" => Simd::Avx2,
            "portable" | "scalar" | "baseline" => Simd::Portable,
            other => {
                return Err(format!(
                    "{other:?} is not a SIMD level: use auto, avx512, avx2 or portable"
                ))
            }
        };
        simd.unsupported().map_or(Ok(simd), Err)
    }

    /// Why this CPU cannot run this level, if it cannot.
    fn unsupported(self) -> Option<String> {
        (!self.is_supported()).then(|| {
            format!(
                "this CPU has no {self} (its widest level is {}): choose auto or a narrower level",
                Simd::detected()
            )
        })
    }

    /// f32 FMA lanes per instruction (what the FMA peak is counted in).
    pub fn lanes(self) -> usize {
        match self {
            Simd::Avx512 => 16,
            Simd::Avx2 => 8,
            Simd::Portable => 4,
        }
    }

    /// The name `NOBUBBLE_SIMD` takes.
    pub fn name(self) -> &'static str {
        match self {
            Simd::Avx512 => "avx512",
            Simd::Avx2 => "avx2",
            Simd::Portable => "portable",
        }
    }
}

/// Independent FMA chains per probe loop: enough to cover the FMA latency (4–5 cycles) on
/// two pipes, so the loop runs at the units' throughput.
const FMA_CHAINS: usize = 12;

impl Simd {
    /// The single-core FMA peak at this level, in FLOP/s: the best of repeated timings of a
    /// loop of independent vector FMAs for about `seconds` (2 FLOPs per lane per FMA). The
    /// denominator of "share of the core's FMA peak": measured, because the FMA pipes and
    /// clock of the CPU are not known from the instruction set alone (a Zen 4 core runs
    /// AVX-512 FMAs at the AVX2 rate; an Intel server core at twice it).
    pub fn fma_peak_flops(self, seconds: f64) -> f64 {
        const ITERS: usize = 20_000;
        // An unsupported level is probed (and counted) as the portable loop it falls to.
        let level = if self.is_supported() {
            self
        } else {
            Simd::Portable
        };
        let start = std::time::Instant::now();
        let mut best = f64::INFINITY;
        let mut sink = 0.0f32;
        for rep in 0.. {
            let t0 = std::time::Instant::now();
            sink += fma_loop(level, ITERS, rep as f32 * 1e-9);
            best = best.min(t0.elapsed().as_secs_f64());
            if rep >= 3 && start.elapsed().as_secs_f64() >= seconds {
                break;
            }
        }
        std::hint::black_box(sink);
        (2 * level.lanes() * FMA_CHAINS * ITERS) as f64 / best.max(1e-12)
    }
}

/// `iters` rounds of [`FMA_CHAINS`] independent `acc = acc·a + b` at `simd`'s width.
fn fma_loop(simd: Simd, iters: usize, seed: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx512f")]
        unsafe fn wide(iters: usize, seed: f32) -> f32 {
            let (a, b) = (_mm512_set1_ps(0.999_9), _mm512_set1_ps(seed));
            let mut acc = [_mm512_set1_ps(1.0); FMA_CHAINS];
            for _ in 0..iters {
                for v in acc.iter_mut() {
                    *v = _mm512_fmadd_ps(*v, a, b);
                }
            }
            acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn narrow(iters: usize, seed: f32) -> f32 {
            let (a, b) = (_mm256_set1_ps(0.999_9), _mm256_set1_ps(seed));
            let mut acc = [_mm256_set1_ps(1.0); FMA_CHAINS];
            for _ in 0..iters {
                for v in acc.iter_mut() {
                    *v = _mm256_fmadd_ps(*v, a, b);
                }
            }
            let mut out = [0.0f32; 8];
            let sum = acc
                .iter()
                .fold(_mm256_setzero_ps(), |s, &v| _mm256_add_ps(s, v));
            _mm256_storeu_ps(out.as_mut_ptr(), sum);
            out.iter().sum()
        }
        match simd {
            // SAFETY: a level other than `Portable` is only used on a CPU that has it.
            Simd::Avx512 if simd.is_supported() => return unsafe { wide(iters, seed) },
            Simd::Avx2 if simd.is_supported() => return unsafe { narrow(iters, seed) },
            _ => {}
        }
    }
    let _ = simd;
    // Portable: four-lane chains of separate multiply and add (what the baseline can do).
    let mut acc = [[1.0f32; 4]; FMA_CHAINS];
    for _ in 0..iters {
        for lanes in acc.iter_mut() {
            for v in lanes.iter_mut() {
                *v = *v * 0.999_9 + seed;
            }
        }
    }
    acc.iter().flatten().sum()
}

impl fmt::Display for Simd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unsupported_levels_are_errors() {
        assert_eq!(Simd::parse("auto").unwrap(), Simd::detected());
        assert_eq!(Simd::parse(" AVX2 ").map(|s| s.name()).ok(), {
            Simd::Avx2.is_supported().then_some("avx2")
        });
        assert_eq!(Simd::parse("portable").unwrap(), Simd::Portable);
        let err = Simd::parse("sse9").unwrap_err().to_string();
        assert!(
            err.contains("not a SIMD level") && err.contains("avx2"),
            "{err}"
        );
        for s in Simd::ALL {
            assert_eq!(Simd::parse(s.name()).is_ok(), s.is_supported(), "{s}");
        }
        assert!(Simd::detected().is_supported() && Simd::Portable.is_supported());
    }

    #[test]
    fn the_fma_probe_measures_a_plausible_peak() {
        let peak = Simd::detected().fma_peak_flops(0.01);
        // Any CPU this runs on does between 1 and 1000 GFLOP/s per core.
        assert!((1e9..1e12).contains(&peak), "{peak}");
    }
}
