//! NVLink topology: survey each GPU's active links through NVML, then resolve the
//! survey (pure) into each GPU's `nvlink_peers`, one entry per link.
//!
//! Direct GPU-to-GPU links name the peer by its remote PCI bus ID. NVSwitch boards
//! (HGX/DGX) are different: every link ends at a switch, whose bus ID is no GPU. All
//! GPUs with at least one active switch link share the fabric, so each is a peer of all
//! the others; the number of entries per peer is the smaller of the two GPUs' switch
//! link counts (the bandwidth one GPU can push to the other through the fabric).
//! A link is a switch link when NVML says so (`nvmlDeviceGetNvLinkRemoteDeviceType`),
//! or, where that call fails, when its remote bus ID is not one of this node's GPUs.

use nvml_wrapper::Device;
use tessera_nvml_raw::{self as raw, NvLinkRemote};

use super::facts::format_bus_id;

/// The far end of one active link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEnd {
    /// NVML says a GPU, at this bus ID.
    Gpu(String),
    Switch,
    /// A CPU (IBM NPU): not a peer.
    Cpu,
    /// NVML could not say what it is; the bus ID decides (a GPU's, or a switch).
    Unknown(Option<String>),
}

/// One GPU's active links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSurvey {
    pub uuid: String,
    pub bus_id: String,
    pub links: Vec<LinkEnd>,
}

/// Peers (UUIDs, one per link) of each surveyed GPU, in survey order.
pub fn resolve_peers(surveys: &[LinkSurvey]) -> Vec<Vec<String>> {
    let uuid_at = |bus: &str| {
        surveys
            .iter()
            .find(|s| s.bus_id.eq_ignore_ascii_case(bus))
            .map(|s| s.uuid.clone())
    };
    let mut switch_links = vec![0usize; surveys.len()];
    let mut direct: Vec<Vec<String>> = vec![Vec::new(); surveys.len()];
    for (i, s) in surveys.iter().enumerate() {
        for end in &s.links {
            match end {
                LinkEnd::Gpu(bus) => {
                    if let Some(peer) = uuid_at(bus).filter(|p| *p != s.uuid) {
                        direct[i].push(peer);
                    }
                }
                LinkEnd::Switch => switch_links[i] += 1,
                LinkEnd::Cpu => {}
                LinkEnd::Unknown(bus) => match bus.as_deref().and_then(uuid_at) {
                    Some(peer) if peer != s.uuid => direct[i].push(peer),
                    Some(_) => {}
                    None => switch_links[i] += 1,
                },
            }
        }
    }
    (0..surveys.len())
        .map(|i| {
            let mut peers = direct[i].clone();
            for (j, other) in surveys.iter().enumerate() {
                let shared = switch_links[i].min(switch_links[j]);
                if i != j && shared > 0 {
                    peers.extend(std::iter::repeat_n(other.uuid.clone(), shared));
                }
            }
            peers
        })
        .collect()
}

/// Survey the active links of `dev` (`uuid`, `bus_id` already known). A GPU without
/// NVLink support has no links; an error on one link skips that link.
pub fn survey(dev: &Device<'_>, uuid: &str, bus_id: &str) -> LinkSurvey {
    let mut links = Vec::new();
    for link in 0..raw::NVLINK_MAX_LINKS {
        let wrapper = dev.link_wrapper_for(link);
        match wrapper.is_active() {
            Ok(true) => {}
            Ok(false) => continue,
            // NotSupported on the first link: no NVLink at all. InvalidArg: past the
            // GPU's last link.
            Err(_) => continue,
        }
        let remote_bus = wrapper
            .remote_pci_info()
            .ok()
            .and_then(|p| format_bus_id(&p.bus_id));
        let end = match raw::nvlink_remote(dev, link) {
            Ok(NvLinkRemote::Gpu) => match remote_bus {
                Some(bus) => LinkEnd::Gpu(bus),
                None => LinkEnd::Unknown(None),
            },
            Ok(NvLinkRemote::Switch) => LinkEnd::Switch,
            Ok(NvLinkRemote::IbmNpu) => LinkEnd::Cpu,
            Ok(NvLinkRemote::Unknown) | Err(_) => LinkEnd::Unknown(remote_bus),
        };
        links.push(end);
    }
    LinkSurvey {
        uuid: uuid.to_string(),
        bus_id: bus_id.to_string(),
        links,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(uuid: &str, bus: &str, links: Vec<LinkEnd>) -> LinkSurvey {
        LinkSurvey {
            uuid: uuid.into(),
            bus_id: bus.into(),
            links,
        }
    }

    fn to(bus: &str) -> LinkEnd {
        LinkEnd::Gpu(bus.into())
    }

    #[test]
    fn direct_links_map_bus_ids_to_uuids_one_entry_per_link() {
        let s = vec![
            gpu(
                "GPU-a",
                "0000:07:00.0",
                vec![to("0000:0F:00.0"), to("0000:0f:00.0"), to("0000:47:00.0")],
            ),
            gpu("GPU-b", "0000:0F:00.0", vec![to("0000:07:00.0"); 2]),
            gpu("GPU-c", "0000:47:00.0", vec![to("0000:07:00.0")]),
            gpu("GPU-d", "0000:4E:00.0", vec![]),
        ];
        let peers = resolve_peers(&s);
        assert_eq!(peers[0], vec!["GPU-b", "GPU-b", "GPU-c"]);
        assert_eq!(peers[1], vec!["GPU-a", "GPU-a"]);
        assert_eq!(peers[2], vec!["GPU-a"]);
        assert!(peers[3].is_empty());
    }

    #[test]
    fn nvswitch_boards_make_every_switched_gpu_a_peer() {
        let s = vec![
            gpu("GPU-a", "0000:07:00.0", vec![LinkEnd::Switch; 18]),
            gpu("GPU-b", "0000:0F:00.0", vec![LinkEnd::Switch; 18]),
            gpu("GPU-c", "0000:47:00.0", vec![LinkEnd::Switch; 12]),
            gpu("GPU-pcie", "0000:B7:00.0", vec![]),
        ];
        let peers = resolve_peers(&s);
        let count = |i: usize, uuid: &str| peers[i].iter().filter(|p| *p == uuid).count();
        assert_eq!(count(0, "GPU-b"), 18);
        assert_eq!(count(0, "GPU-c"), 12);
        assert_eq!(count(2, "GPU-a"), 12);
        assert_eq!(count(0, "GPU-a"), 0, "never its own peer");
        assert_eq!(count(0, "GPU-pcie"), 0);
        assert!(peers[3].is_empty());
    }

    #[test]
    fn unknown_links_resolve_by_bus_id_and_cpus_are_not_peers() {
        let s = vec![
            gpu(
                "GPU-a",
                "0000:07:00.0",
                vec![
                    LinkEnd::Unknown(Some("0000:0F:00.0".into())),
                    LinkEnd::Unknown(Some("0000:C0:00.0".into())),
                    LinkEnd::Cpu,
                ],
            ),
            gpu(
                "GPU-b",
                "0000:0F:00.0",
                vec![LinkEnd::Unknown(None), to("0000:0F:00.0")],
            ),
        ];
        let peers = resolve_peers(&s);
        // Link 0 is GPU-b; link 1 ends at a non-GPU bus ID (a switch) and so does
        // GPU-b's unknown link: they share the fabric with one link each.
        assert_eq!(peers[0], vec!["GPU-b", "GPU-b"]);
        // GPU-b's link to its own bus ID is ignored.
        assert_eq!(peers[1], vec!["GPU-a"]);
    }
}
