//! Which steady subscribers are checked (`--check-subs K`): K of the `--subs` do every check and
//! measure latency ([`crate::subscriber`]); the others are light ([`crate::light`]). The sample
//! is spread evenly over the service addresses, the subscriber threads and the order the
//! subscribers connect in, so that no address, thread or place in a fan-out is over- or
//! under-represented in the latency percentiles it alone yields.

/// Whether steady subscriber `k` of `subs` is one of the `check` checked ones, subscriber k
/// reading from address k mod `services` on thread k mod `threads` (as [`crate::crew::plan`]
/// places it).
///
/// Why this way: the subscribers fall into `L = lcm(services, threads)` classes by k mod L
/// (each class one address and one thread, classes differing in size by one at most). The K
/// checked ones are dealt over the classes as evenly as K allows (K / L each, one more to the
/// first K mod L classes), and inside a class of m subscribers the j-th of them (j = k div L, in
/// connecting order) is checked when j·K_c mod m < K_c: K_c of them, evenly spaced from the
/// first (Bresenham's rule: j·K_c/m reaches a new integer at each of them). Taking the first K
/// instead would put the sample at the head of every fan-out, and taking every (N/K)-th would
/// put it all on one thread when N/K is a multiple of the thread count. The K_c never exceed their class's size, so exactly min(K, subs) are
/// checked.
pub fn checked(k: usize, subs: usize, check: usize, services: usize, threads: usize) -> bool {
    if check >= subs {
        return true;
    }
    let l = lcm(services.max(1), threads.max(1));
    let (class, j) = (k % l, k / l);
    let share = |total: usize| total / l + usize::from(class < total % l);
    let (m, kc) = (share(subs), share(check));
    m > 0 && (j * kc) % m < kc
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked ones of `subs`, by index.
    fn sample(subs: usize, check: usize, services: usize, threads: usize) -> Vec<usize> {
        (0..subs)
            .filter(|&k| checked(k, subs, check, services, threads))
            .collect()
    }

    #[test]
    fn exactly_k_subscribers_are_checked() {
        for subs in [1, 2, 3, 5, 7, 64, 255, 256, 1024] {
            for check in [0, 1, 2, 3, 31, 32, 33, 256, 2000] {
                for services in 1..=3 {
                    for threads in 1..=4 {
                        assert_eq!(
                            sample(subs, check, services, threads).len(),
                            check.min(subs),
                            "{subs} {check} {services} {threads}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn checked_subscribers_spread_over_services_threads_and_connect_order() {
        // 256 subscribers, 32 checked, one address, two threads: 16 per thread, evenly spaced.
        let s = sample(256, 32, 1, 2);
        assert_eq!(s.iter().filter(|&&k| k % 2 == 0).count(), 16);
        assert_eq!(s.first(), Some(&0));
        assert!(s.iter().any(|&k| k >= 240), "reaches the end: {s:?}");
        assert!(s.windows(2).all(|w| w[1] - w[0] <= 16), "{s:?}");
        // Two addresses, two threads, three addresses, one thread: each address its share.
        for (services, threads) in [(2, 2), (3, 1), (2, 4)] {
            let s = sample(1024, 32, services, threads);
            for i in 0..services {
                let n = s.iter().filter(|&&k| k % services == i).count();
                assert!(
                    n.abs_diff(32 / services) <= 1,
                    "{services} {threads}: {s:?}"
                );
            }
            for t in 0..threads {
                let n = s.iter().filter(|&&k| k % threads == t).count();
                assert!(n.abs_diff(32 / threads) <= 1, "{services} {threads}: {s:?}");
            }
        }
    }

    #[test]
    fn all_subscribers_are_checked_by_default() {
        assert_eq!(sample(64, usize::MAX, 2, 2).len(), 64);
    }
}
