//! MIG catalog: the real MIG profiles and placement rules of each MIG-capable GPU model,
//! and the validation that places a list of profiles on one GPU or says exactly why not.
//!
//! The per-model data lives in `catalog/tables.rs` (one table per model, with its sources); this
//! file holds the types and the model-independent logic. There is no branch per model:
//! a GPU is a row of `total_slots` memory-slice slots, each profile occupies `size`
//! consecutive slots starting at one of its `placements`, and a layout fits when every
//! instance gets a start slot with no overlap, within the per-profile instance limits,
//! the compute-slice budget and the one-media-extension rule.

mod tables;

use serde::Serialize;
use std::fmt::Write as _;

/// One GPU-instance profile of one model, as `nvidia-smi mig -lgip` / `-lgipp` report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MigProfile {
    /// Profile name without the `MIG ` prefix, e.g. `"1g.10gb"` or `"1g.10gb+me"`.
    pub name: &'static str,
    /// Compute slices (the `g` in the name).
    pub compute_slices: u8,
    /// Memory slices out of the model's total (8 on A100/H100/H200/B200, 4 on A30).
    pub memory_slices: u8,
    /// Memory of one instance in MiB (NVML `memorySizeMB`).
    pub memory_mib: u64,
    /// Streaming multiprocessors of one instance.
    pub sm_count: u32,
    /// Placement slots one instance occupies (the `:N` of `-lgipp`).
    pub size: u8,
    /// Valid start slots (the `{...}` of `-lgipp`).
    pub placements: &'static [u8],
    /// Most instances of this profile one GPU can hold.
    pub max_instances: u8,
    /// `+me`: the instance owns the GPU's media engines (JPEG/OFA).
    pub media_extensions: bool,
    /// GPU-instance profile id as NVML / `nvidia-smi mig -lgip` report it (19 = 1g.10gb).
    pub gi_profile_id: u32,
}

/// The MIG geometry of one GPU model.
#[derive(Debug, Serialize)]
pub struct ModelCatalog {
    /// Short model name, e.g. `"A100-80GB"`.
    pub model: &'static str,
    /// Placement slots (memory slices) of the whole GPU.
    pub total_slots: u8,
    /// Compute slices of the whole GPU (7, or 4 on A30).
    pub compute_slices: u8,
    /// SMs of the whole GPU outside MIG mode.
    pub total_sms: u32,
    /// Memory of the whole GPU in MiB as NVML reports it.
    pub memory_mib: u64,
    /// Instances with media extensions one GPU can hold at once (it has one OFA).
    pub max_media_instances: u8,
    /// Every GPU-instance profile of the model.
    pub profiles: &'static [MigProfile],
    /// NVIDIA mig-parted's `all-balanced` mix for this model: (profile, count).
    pub balanced: &'static [(&'static str, u8)],
    /// Token sets that identify the model in an NVML product name; the longest match wins.
    #[serde(skip)]
    name_keys: &'static [&'static [&'static str]],
    /// Total memory (MiB, inclusive) a GPU of this model reports; disambiguates 40/80 GB.
    #[serde(skip)]
    memory_range_mib: (u64, u64),
}

/// One instance placed on a GPU: its profile and first slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub profile: &'static MigProfile,
    pub start: u8,
}

impl Placement {
    /// Slots `start..start + size` this instance occupies.
    pub fn slots(&self) -> std::ops::Range<u8> {
        self.start..self.start + self.profile.size
    }
}

/// Why a layout does not fit a GPU. Every message names the model and the reason.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum LayoutError {
    #[error("{model} has no MIG profile {profile:?}; valid profiles: {valid}")]
    UnknownProfile {
        model: String,
        profile: String,
        valid: String,
    },
    #[error(
        "{model} holds at most {max} instance(s) of MIG profile {profile}, the layout asks for {requested}"
    )]
    TooManyInstances {
        model: String,
        profile: String,
        requested: usize,
        max: u8,
    },
    #[error(
        "{model} holds at most {max} media-extension (+me) instance(s), the layout asks for {requested} ({profiles})"
    )]
    TooManyMediaExtensions {
        model: String,
        profiles: String,
        requested: usize,
        max: u8,
    },
    #[error("{model} has {available} compute slices, the layout needs {requested} ({profiles})")]
    OutOfComputeSlices {
        model: String,
        profiles: String,
        requested: u32,
        available: u8,
    },
    #[error("{model} has {available} memory slices, the layout needs {requested} ({profiles})")]
    OutOfMemorySlices {
        model: String,
        profiles: String,
        requested: u32,
        available: u8,
    },
    #[error(
        "{model}: no valid placement for {profiles}: the profiles' allowed start slots overlap in every arrangement"
    )]
    NoValidPlacement { model: String, profiles: String },
    #[error(
        "{model}: existing instance {profile} at slot {start} is not a valid placement or overlaps another"
    )]
    InvalidExisting {
        model: String,
        profile: String,
        start: u8,
    },
    #[error("{model} has no named MIG layout {layout:?}; valid layouts: {valid}")]
    UnknownLayout {
        model: String,
        layout: String,
        valid: String,
    },
}

pub type Result<T> = std::result::Result<T, LayoutError>;

/// Every model in the catalog.
pub fn all_models() -> &'static [ModelCatalog] {
    tables::MODELS
}

/// Finds the catalog for a GPU by its NVML product name (`"NVIDIA A100-SXM4-80GB"`,
/// `"NVIDIA H100 80GB HBM3"`, `"NVIDIA H100 NVL"`, `"NVIDIA H200"`, `"NVIDIA GB200"`)
/// or a short name (`"A100-80GB"`, `"H100-94GB"`, `"H200-141GB"`). A non-zero
/// `memory_mib` (NVML total memory) must fall in the model's range, which tells the
/// 40 GB and 80 GB A100 apart; with `0` the name alone decides (ties: table order).
pub fn lookup(product_name: &str, memory_mib: u64) -> Option<&'static ModelCatalog> {
    let trimmed = product_name.trim();
    if let Some(m) = tables::MODELS
        .iter()
        .find(|m| m.model.eq_ignore_ascii_case(trimmed))
    {
        return Some(m);
    }
    let tokens = tokenize(trimmed);
    let mut best: Option<(usize, &'static ModelCatalog)> = None;
    for m in tables::MODELS {
        let (lo, hi) = m.memory_range_mib;
        if memory_mib > 0 && !(lo..=hi).contains(&memory_mib) {
            continue;
        }
        let score = m
            .name_keys
            .iter()
            .filter(|key| key.iter().all(|t| tokens.iter().any(|have| have == t)))
            .map(|key| key.len())
            .max();
        if let Some(score) = score {
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, m));
            }
        }
    }
    best.map(|(_, m)| m)
}

/// Upper-case tokens of a product name without the vendor: "NVIDIA H100 80GB HBM3" ->
/// ["H100", "80GB", "HBM3"]; "A100-SXM4-80GB" -> ["A100", "SXM4", "80GB"].
fn tokenize(name: &str) -> Vec<String> {
    name.split(|c: char| c.is_whitespace() || c == '-' || c == '_')
        .filter(|t| !t.is_empty())
        .map(str::to_ascii_uppercase)
        .filter(|t| t != "NVIDIA")
        .collect()
}

impl ModelCatalog {
    /// The profile called `name`: accepts `"1g.10gb"`, `"mig-1g.10gb"`, `"MIG 1g.10gb"`
    /// (case-insensitive).
    pub fn profile(&self, name: &str) -> Option<&'static MigProfile> {
        let name = name.trim();
        let bare = strip_prefix_ci(name, "mig-")
            .or_else(|| strip_prefix_ci(name, "mig "))
            .unwrap_or(name)
            .trim();
        self.profiles
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(bare))
    }

    /// Valid profile names, comma-separated, for error messages.
    pub fn profile_names(&self) -> String {
        join(self.profiles.iter().map(|p| p.name))
    }

    /// Places `profiles` on one GPU of this model. The search tries every arrangement
    /// (most constrained profile first), so a layout that fits in any order is never
    /// refused. The result is in the order of `profiles`; an error names the reason.
    pub fn place(&self, profiles: &[&str]) -> Result<Vec<Placement>> {
        self.place_around(&[], profiles)
    }

    /// Like [`ModelCatalog::place`] on a GPU that already holds `existing` instances,
    /// which keep their slots: a layout change adds instances without moving the ones
    /// that did not change. Budgets count the existing instances too. Returns the
    /// placements of `profiles` only, in their order.
    pub fn place_around(
        &self,
        existing: &[Placement],
        profiles: &[&str],
    ) -> Result<Vec<Placement>> {
        let resolved = profiles
            .iter()
            .map(|name| self.profile(name).ok_or_else(|| self.unknown_profile(name)))
            .collect::<Result<Vec<_>>>()?;
        let mut used = 0u32;
        let mut all = Vec::with_capacity(existing.len() + resolved.len());
        for placed in existing {
            let Some(profile) = self.profile(placed.profile.name) else {
                return Err(self.unknown_profile(placed.profile.name));
            };
            let free = self
                .slot_mask(profile, placed.start)
                .filter(|mask| used & mask == 0 && profile.placements.contains(&placed.start));
            let Some(mask) = free else {
                return Err(LayoutError::InvalidExisting {
                    model: self.model.to_string(),
                    profile: profile.name.to_string(),
                    start: placed.start,
                });
            };
            used |= mask;
            all.push(profile);
        }
        all.extend(resolved.iter().copied());
        self.check_budget(&all)?;

        let mut order: Vec<usize> = (0..resolved.len()).collect();
        order.sort_by_key(|&i| {
            let p = resolved[i];
            (p.placements.len(), std::cmp::Reverse(p.size), p.name)
        });
        let mut starts = vec![0u8; resolved.len()];
        if self.search(&resolved, &order, 0, used, &mut starts) {
            Ok(resolved
                .iter()
                .zip(starts)
                .map(|(profile, start)| Placement { profile, start })
                .collect())
        } else {
            Err(LayoutError::NoValidPlacement {
                model: self.model.to_string(),
                profiles: describe(&all),
            })
        }
    }

    /// Expands a named layout into its profile list: `all-<profile>` (as many instances
    /// as fit on one GPU; mig-parted's `all-1g.10gb.me` spelling is accepted for `+me`),
    /// or `balanced` / `all-balanced` (NVIDIA mig-parted's balanced mix for the model).
    pub fn named_layout(&self, name: &str) -> Result<Vec<&'static str>> {
        let trimmed = name.trim();
        if trimmed.eq_ignore_ascii_case("balanced") || trimmed.eq_ignore_ascii_case("all-balanced")
        {
            let list: Vec<&'static str> = self
                .balanced
                .iter()
                .flat_map(|&(p, n)| std::iter::repeat_n(p, usize::from(n)))
                .collect();
            // The table is data: prove the mix fits before handing it out.
            self.place(&list)?;
            return Ok(list);
        }
        let Some(rest) = strip_prefix_ci(trimmed, "all-") else {
            return Err(self.unknown_layout(trimmed));
        };
        let profile = match self.profile(rest) {
            Some(p) => p,
            None => {
                let plus_me = rest
                    .strip_suffix(".me")
                    .map(|base| format!("{base}+me"))
                    .and_then(|n| self.profile(&n));
                plus_me.ok_or_else(|| self.unknown_profile(rest))?
            }
        };
        for count in (1..=usize::from(profile.max_instances)).rev() {
            let list = vec![profile.name; count];
            if self.place(&list).is_ok() {
                return Ok(list);
            }
        }
        // Every profile fits at least once on an empty GPU; reaching here means the table
        // itself is inconsistent, which the tests rule out. Report it, never panic.
        Err(LayoutError::NoValidPlacement {
            model: self.model.to_string(),
            profiles: profile.name.to_string(),
        })
    }

    /// Named layouts this model accepts, for error messages and `tessera layout`.
    pub fn layout_names(&self) -> Vec<String> {
        let mut names = vec!["all-balanced".to_string(), "balanced".to_string()];
        names.extend(self.profiles.iter().map(|p| format!("all-{}", p.name)));
        names
    }

    fn check_budget(&self, resolved: &[&'static MigProfile]) -> Result<()> {
        for p in self.profiles {
            let requested = resolved.iter().filter(|r| r.name == p.name).count();
            if requested > usize::from(p.max_instances) {
                return Err(LayoutError::TooManyInstances {
                    model: self.model.to_string(),
                    profile: p.name.to_string(),
                    requested,
                    max: p.max_instances,
                });
            }
        }
        let media: Vec<&'static MigProfile> = resolved
            .iter()
            .copied()
            .filter(|p| p.media_extensions)
            .collect();
        if media.len() > usize::from(self.max_media_instances) {
            return Err(LayoutError::TooManyMediaExtensions {
                model: self.model.to_string(),
                profiles: describe(&media),
                requested: media.len(),
                max: self.max_media_instances,
            });
        }
        let compute: u32 = resolved.iter().map(|p| u32::from(p.compute_slices)).sum();
        if compute > u32::from(self.compute_slices) {
            return Err(LayoutError::OutOfComputeSlices {
                model: self.model.to_string(),
                profiles: describe(resolved),
                requested: compute,
                available: self.compute_slices,
            });
        }
        let memory: u32 = resolved.iter().map(|p| u32::from(p.memory_slices)).sum();
        if memory > u32::from(self.total_slots) {
            return Err(LayoutError::OutOfMemorySlices {
                model: self.model.to_string(),
                profiles: describe(resolved),
                requested: memory,
                available: self.total_slots,
            });
        }
        Ok(())
    }

    /// Depth-first search over start slots; `used` is a bit mask of occupied slots.
    /// Identical profiles are placed in increasing start order, so permutations of the
    /// same instances are tried once.
    fn search(
        &self,
        resolved: &[&'static MigProfile],
        order: &[usize],
        depth: usize,
        used: u32,
        starts: &mut [u8],
    ) -> bool {
        let Some(&i) = order.get(depth) else {
            return true;
        };
        let profile = resolved[i];
        let min_start = match depth.checked_sub(1).map(|d| order[d]) {
            Some(prev) if std::ptr::eq(resolved[prev], profile) => starts[prev] + 1,
            _ => 0,
        };
        for &start in profile.placements.iter().filter(|&&s| s >= min_start) {
            let Some(mask) = self.slot_mask(profile, start) else {
                continue;
            };
            if used & mask != 0 {
                continue;
            }
            starts[i] = start;
            if self.search(resolved, order, depth + 1, used | mask, starts) {
                return true;
            }
        }
        false
    }

    /// Bit mask of the slots an instance of `profile` starting at `start` occupies;
    /// `None` when it would run past the last slot.
    fn slot_mask(&self, profile: &MigProfile, start: u8) -> Option<u32> {
        let end = u32::from(start) + u32::from(profile.size);
        (end <= u32::from(self.total_slots) && end < 32)
            .then(|| ((1u32 << profile.size) - 1) << start)
    }

    fn unknown_profile(&self, name: &str) -> LayoutError {
        LayoutError::UnknownProfile {
            model: self.model.to_string(),
            profile: name.trim().to_string(),
            valid: self.profile_names(),
        }
    }

    fn unknown_layout(&self, name: &str) -> LayoutError {
        LayoutError::UnknownLayout {
            model: self.model.to_string(),
            layout: name.to_string(),
            valid: self.layout_names().join(", "),
        }
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

fn join<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names.collect::<Vec<_>>().join(", ")
}

/// "2x 1g.10gb + 1x 3g.40gb" in first-seen order.
fn describe(profiles: &[&'static MigProfile]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for p in profiles {
        match counts.iter_mut().find(|(n, _)| *n == p.name) {
            Some((_, c)) => *c += 1,
            None => counts.push((p.name, 1)),
        }
    }
    let mut out = String::new();
    for (i, (name, count)) in counts.iter().enumerate() {
        if i > 0 {
            out.push_str(" + ");
        }
        let _ = write!(out, "{count}x {name}");
    }
    out
}

#[cfg(test)]
mod tests;
