//! What a container's vGPU request costs a queue: HAMi's resources are written per vGPU
//! (`nvidia.com/gpumem: 10240` with `nvidia.com/gpu: 2` is 10 GiB on each of two GPUs),
//! while a ClusterQueue's `nominalQuota` for `nvidia.com/gpumem` or `nvidia.com/gpucores`
//! counts totals. [`charged`] turns one container's resources into what the queue is
//! charged: each share resource times the vGPU count.
//!
//! Rules (docs/hami.md, "Quota"):
//! - `gpumem` (MiB), `gpumem-percentage` (%) and `gpucores` (%) are multiplied by the
//!   container's `gpu` count; a share resource without a count is charged for one vGPU
//!   (HAMi's reading; Tessera's webhook refuses such a pod, so this only keeps a pod that
//!   slipped past from being charged nothing);
//! - `gpu` itself and every other resource are charged as written;
//! - memory given only as a percentage is charged as `gpumem-percentage`: its MiB depend
//!   on the GPU the pod lands on, unknown at admission. A pod with neither is charged no
//!   memory (HAMi's default is the whole GPU's memory, also unknown at admission); a
//!   queue that must cap memory should cap `gpu` too.
//!
//! Pure: resource maps in, resource map out.

use super::request::ResourceNames;
use crate::quota::quantity::Quantity;
use std::collections::BTreeMap;

/// One container's resources (requests, limits filling the gaps) with its vGPU shares
/// multiplied by its vGPU count.
pub fn charged(
    resources: BTreeMap<String, Quantity>,
    names: &ResourceNames,
) -> BTreeMap<String, Quantity> {
    let shares = names.share_names();
    if !shares.iter().any(|n| resources.contains_key(*n)) {
        return resources;
    }
    let count = resources.get(&names.gpu).map_or(Quantity::units(1), |q| *q);
    resources
        .into_iter()
        .map(|(name, q)| {
            if shares.contains(&name.as_str()) {
                (name, times(q, count))
            } else {
                (name, q)
            }
        })
        .collect()
}

/// `per_vgpu` × `count` (both in milli-units), saturating.
fn times(per_vgpu: Quantity, count: Quantity) -> Quantity {
    let milli = i128::from(per_vgpu.0) * i128::from(count.0) / 1000;
    Quantity(i64::try_from(milli).unwrap_or(if milli < 0 { i64::MIN } else { i64::MAX }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vgpu::request::DEFAULT_PREFIX;

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity::parse(v).expect("a quantity")))
            .collect()
    }

    #[test]
    fn shares_are_multiplied_by_the_vgpu_count() {
        let names = ResourceNames::new(DEFAULT_PREFIX);
        let cases = [
            (
                "the issue's pod: one vGPU",
                map(&[
                    ("nvidia.com/gpu", "1"),
                    ("nvidia.com/gpumem", "10240"),
                    ("nvidia.com/gpucores", "30"),
                ]),
                map(&[
                    ("nvidia.com/gpu", "1"),
                    ("nvidia.com/gpumem", "10240"),
                    ("nvidia.com/gpucores", "30"),
                ]),
            ),
            (
                "two vGPUs of 10 GiB and 30 %",
                map(&[
                    ("nvidia.com/gpu", "2"),
                    ("nvidia.com/gpumem", "10240"),
                    ("nvidia.com/gpucores", "30"),
                    ("cpu", "4"),
                ]),
                map(&[
                    ("nvidia.com/gpu", "2"),
                    ("nvidia.com/gpumem", "20480"),
                    ("nvidia.com/gpucores", "60"),
                    ("cpu", "4"),
                ]),
            ),
            (
                "a percentage is charged as a percentage",
                map(&[
                    ("nvidia.com/gpu", "4"),
                    ("nvidia.com/gpumem-percentage", "25"),
                ]),
                map(&[
                    ("nvidia.com/gpu", "4"),
                    ("nvidia.com/gpumem-percentage", "100"),
                ]),
            ),
            (
                "shares without a count: one vGPU, never nothing",
                map(&[("nvidia.com/gpumem", "1024")]),
                map(&[("nvidia.com/gpumem", "1024")]),
            ),
            (
                "whole GPUs are charged as written",
                map(&[("nvidia.com/gpu", "8"), ("cpu", "32")]),
                map(&[("nvidia.com/gpu", "8"), ("cpu", "32")]),
            ),
        ];
        for (what, resources, want) in cases {
            assert_eq!(charged(resources, &names), want, "{what}");
        }
    }

    #[test]
    fn another_prefix_is_read_under_its_own_names() {
        let names = ResourceNames::new("example.com");
        let resources = map(&[
            ("example.com/gpu", "3"),
            ("example.com/gpucores", "20"),
            ("nvidia.com/gpucores", "20"),
        ]);
        let got = charged(resources, &names);
        assert_eq!(got["example.com/gpucores"], Quantity::units(60));
        assert_eq!(got["nvidia.com/gpucores"], Quantity::units(20));
    }

    #[test]
    fn absurd_amounts_saturate_instead_of_wrapping() {
        let names = ResourceNames::new(DEFAULT_PREFIX);
        let resources = map(&[
            ("nvidia.com/gpu", "9223372036854775"),
            ("nvidia.com/gpumem", "9223372036854775"),
        ]);
        assert_eq!(
            charged(resources, &names)["nvidia.com/gpumem"],
            Quantity(i64::MAX)
        );
    }
}
