//! Cores lent by waiting ranks to working ones.
//!
//! Why: ranks that are threads of one process each own a core, and a pipeline's ranks are
//! never equally loaded (the embedding and the head sit on some ranks, the bubble idles the
//! others at the start and end of a step). While a rank waits for a message its core does
//! nothing; a [`CoreLender`] shared by the ranks lets a rank in a large matrix product, a
//! large row-wise kernel or an attention core take such a core for that operation. Their
//! bits do not depend on the thread count (`gemm` splits the output, never the sum; rows and
//! sequences are independent), so lending changes timing only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The cores of waiting ranks, offered to the others' products.
pub struct CoreLender {
    /// (cores offered by waiting ranks, cores borrowed now).
    state: Mutex<(usize, usize)>,
    /// Off while pass times are measured for planning: a pass that borrowed would look
    /// faster than its rank alone runs it.
    enabled: AtomicBool,
    /// The threads borrowing operations run on, two each (its own core's and the borrowed
    /// one's): as many as the ranks, so that every pair of a borrower and a lender has two.
    pool: rayon::ThreadPool,
}

impl std::fmt::Debug for CoreLender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (offered, borrowed) = *self.state.lock().unwrap_or_else(|e| e.into_inner());
        write!(f, "CoreLender(offered={offered}, borrowed={borrowed})")
    }
}

/// A waiting rank's core on offer, withdrawn when dropped (also when the wait fails or
/// panics).
pub struct Offer<'a> {
    lender: &'a CoreLender,
}

impl Drop for Offer<'_> {
    fn drop(&mut self) {
        self.lender.update(|s| s.0 = s.0.saturating_sub(1));
    }
}

/// A borrowed core, given back when dropped.
pub struct Loan<'a> {
    lender: &'a CoreLender,
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        self.lender.update(|s| s.1 = s.1.saturating_sub(1));
    }
}

impl CoreLender {
    /// A lender for `ranks` rank threads; `None` if its threads cannot be made (then no core
    /// is ever lent).
    pub fn new(ranks: usize) -> Option<Arc<CoreLender>> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(ranks.max(2))
            .thread_name(|i| format!("nobubble-lent-{i}"))
            .build()
            .ok()?;
        Some(Arc::new(CoreLender {
            state: Mutex::new((0, 0)),
            enabled: AtomicBool::new(true),
            pool,
        }))
    }

    fn update<R>(&self, f: impl FnOnce(&mut (usize, usize)) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A rank starts waiting: its core may be borrowed until the [`Offer`] is dropped. If
    /// it is borrowed then, the operation that has it finishes on it (one product's, row-wise
    /// kernel's or attention core's time at most: a few milliseconds at the sizes that
    /// borrow), sharing the core with the rank meanwhile.
    pub fn offer(&self) -> Offer<'_> {
        self.update(|s| s.0 += 1);
        Offer { lender: self }
    }

    /// Lends (`true`, the default) or stops lending.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// A core nobody uses, if one is offered (and lending is on).
    pub fn borrow(&self) -> Option<Loan<'_>> {
        if !self.enabled.load(Ordering::Relaxed) {
            return None;
        }
        self.update(|s| {
            (s.0 > s.1).then(|| {
                s.1 += 1;
            })
        })
        .map(|()| Loan { lender: self })
    }
}

impl Loan<'_> {
    /// Runs `work` on the lender's threads (the caller's thread waits meanwhile); `work` asks
    /// for two of them: its own core's and the borrowed one's.
    pub fn run<R: Send>(&self, work: impl FnOnce() -> R + Send) -> R {
        self.lender.pool.install(work)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_offered_core_that_nobody_has_is_lent() {
        let lender = CoreLender::new(2).unwrap();
        assert!(lender.borrow().is_none(), "nobody waits yet");
        let offer = lender.offer();
        let loan = lender.borrow().expect("one core offered");
        assert!(lender.borrow().is_none(), "the one core is out");
        // Its rank stops waiting while the core is out: the loan runs to its end, and the
        // core is not lent again.
        drop(offer);
        drop(loan);
        assert!(lender.borrow().is_none());
        let _offers = (lender.offer(), lender.offer());
        let (a, b) = (lender.borrow(), lender.borrow());
        assert!(a.is_some() && b.is_some() && lender.borrow().is_none());
        drop((a, b));
        lender.set_enabled(false);
        assert!(lender.borrow().is_none(), "lending is off");
        lender.set_enabled(true);
        let loan = lender.borrow().expect("lending is on again");
        assert_eq!(loan.run(rayon::current_num_threads), 2);
    }

    #[test]
    fn offers_and_loans_balance_across_threads() {
        let lender = CoreLender::new(4).unwrap();
        std::thread::scope(|scope| {
            for t in 0..4 {
                let lender = &lender;
                scope.spawn(move || {
                    for i in 0..2000 {
                        if (i + t) % 2 == 0 {
                            let _offer = lender.offer();
                            std::hint::spin_loop();
                        } else if let Some(_loan) = lender.borrow() {
                            assert!(lender.state.lock().unwrap().1 >= 1, "a loan is counted");
                        }
                    }
                });
            }
        });
        assert_eq!(*lender.state.lock().unwrap(), (0, 0));
    }
}
