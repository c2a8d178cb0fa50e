//! The closed enumerations of the admin API. Their wire names follow the
//! Atlassian Statuspage v2 API where one exists, so status tooling can read
//! them, and are also what the database stores.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A string that is not one of an enumeration's wire names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} `{value}`; expected one of: {expected}")]
pub struct UnknownVariant {
    /// The enumeration, e.g. "visibility".
    pub kind: &'static str,
    /// What was given.
    pub value: String,
    /// The accepted names, comma separated.
    pub expected: String,
}

macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident, $kind:literal { $($(#[$vmeta:meta])* $variant:ident = $wire:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $wire)] $variant,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The wire (and database) name.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $wire,)+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownVariant;
            fn from_str(s: &str) -> Result<Self, UnknownVariant> {
                match s {
                    $($wire => Ok($name::$variant),)+
                    _ => Err(UnknownVariant {
                        kind: $kind,
                        value: s.to_owned(),
                        expected: [$($wire),+].join(", "),
                    }),
                }
            }
        }
    };
}

wire_enum!(
    /// Who may call a model.
    Visibility, "visibility" {
        /// Every account.
        Public = "public",
        /// Only the accounts on the model's allowlist.
        Private = "private",
    }
);

wire_enum!(
    /// What an operator token may do. `Admin` may do everything; `Responder`
    /// reads, flips visibility and runs incidents; `Node` only registers
    /// workers and sends their heartbeats; `Gateway` only reads the routing
    /// table.
    Role, "role" {
        /// Reads, visibility and incidents.
        Responder = "responder",
        /// Everything.
        Admin = "admin",
        /// Worker registration and heartbeats only.
        Node = "node",
        /// The routing table only.
        Gateway = "gateway",
    }
);

wire_enum!(
    /// What a worker does for its model.
    NodeRole, "node role" {
        /// Computes prompts and sends their KV pages to decode workers.
        Prefill = "prefill",
        /// Lands prompt KV from a prefill worker and generates.
        Decode = "decode",
        /// Prefill and decode in one engine.
        Colocated = "colocated",
    }
);

wire_enum!(
    /// Statuspage incident status.
    IncidentStatus, "incident status" {
        /// Looking into it.
        Investigating = "investigating",
        /// The cause is known.
        Identified = "identified",
        /// A fix is out; watching.
        Monitoring = "monitoring",
        /// Over.
        Resolved = "resolved",
        /// Over, with a postmortem published.
        Postmortem = "postmortem",
    }
);

wire_enum!(
    /// Statuspage incident impact.
    Impact, "impact" {
        /// No impact.
        None = "none",
        /// Minor.
        Minor = "minor",
        /// Major.
        Major = "major",
        /// Critical.
        Critical = "critical",
    }
);

wire_enum!(
    /// Statuspage component status; one component per model.
    ComponentStatus, "component status" {
        /// Working.
        Operational = "operational",
        /// Slow.
        DegradedPerformance = "degraded_performance",
        /// Partly down.
        PartialOutage = "partial_outage",
        /// Down.
        MajorOutage = "major_outage",
        /// Planned work.
        UnderMaintenance = "under_maintenance",
    }
);

impl IncidentStatus {
    /// Whether the incident is over (`resolved` or `postmortem`).
    pub fn is_closed(self) -> bool {
        matches!(self, IncidentStatus::Resolved | IncidentStatus::Postmortem)
    }

    /// The label the feeds print before an update's body ("Investigating").
    pub fn label(self) -> &'static str {
        match self {
            IncidentStatus::Investigating => "Investigating",
            IncidentStatus::Identified => "Identified",
            IncidentStatus::Monitoring => "Monitoring",
            IncidentStatus::Resolved => "Resolved",
            IncidentStatus::Postmortem => "Postmortem",
        }
    }
}

impl ComponentStatus {
    /// Statuspage's roll-up of a component status into a page indicator.
    pub fn indicator(self) -> Impact {
        match self {
            ComponentStatus::Operational => Impact::None,
            ComponentStatus::DegradedPerformance | ComponentStatus::UnderMaintenance => {
                Impact::Minor
            }
            ComponentStatus::PartialOutage => Impact::Major,
            ComponentStatus::MajorOutage => Impact::Critical,
        }
    }

    /// Human label ("Major Outage").
    pub fn label(self) -> &'static str {
        match self {
            ComponentStatus::Operational => "Operational",
            ComponentStatus::DegradedPerformance => "Degraded Performance",
            ComponentStatus::PartialOutage => "Partial Outage",
            ComponentStatus::MajorOutage => "Major Outage",
            ComponentStatus::UnderMaintenance => "Under Maintenance",
        }
    }
}

impl Impact {
    /// The page description Statuspage shows for this indicator.
    pub fn description(self) -> &'static str {
        match self {
            Impact::None => "All Systems Operational",
            Impact::Minor => "Minor Service Outage",
            Impact::Major => "Partial System Outage",
            Impact::Critical => "Major Service Outage",
        }
    }
}

impl Role {
    /// Whether a token of this role may do what `needed` stands for.
    pub fn allows(self, needed: Role) -> bool {
        self == Role::Admin || self == needed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_round_trip() {
        for s in ComponentStatus::ALL {
            assert_eq!(s.as_str().parse::<ComponentStatus>(), Ok(*s));
            let json = serde_json::to_string(s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
        }
        let err = "privat".parse::<Visibility>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown visibility `privat`; expected one of: public, private"
        );
    }

    #[test]
    fn roles_nest_only_under_admin() {
        assert!(Role::Admin.allows(Role::Responder));
        assert!(Role::Admin.allows(Role::Node));
        assert!(!Role::Responder.allows(Role::Admin));
        assert!(!Role::Responder.allows(Role::Node));
        assert!(!Role::Node.allows(Role::Responder));
    }
}
