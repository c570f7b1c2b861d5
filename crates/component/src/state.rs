//! The states of a component (`docs/architecture.md`, the process model).

/// The states of a component:
///
/// ```text
/// Initial ──configure──▶ Configured ──start(run)──▶ Running ──pause──▶ Paused
///    ▲                      │  ▲                      │  ▲               │
///    └──────reset───────────┘  └────────stop──────────┘  └────resume─────┘
/// any state ──fault──▶ Error ──reset──▶ Initial
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum State {
    /// Created, nothing bound.
    Initial,
    /// Configured (sockets bound, files opened): ready to start a run.
    Configured,
    /// Taking a run.
    Running,
    /// The run is paused: producers hold back; data in flight goes on.
    Paused,
    /// Failed; `reset` goes back to Initial.
    Error,
}

impl State {
    /// Every state.
    pub const ALL: [State; 5] = [State::Initial, State::Configured, State::Running, State::Paused, State::Error];

    /// The state's name.
    pub fn name(self) -> &'static str {
        match self {
            State::Initial => "Initial",
            State::Configured => "Configured",
            State::Running => "Running",
            State::Paused => "Paused",
            State::Error => "Error",
        }
    }

    /// The state of a name (`"Running"` …).
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.name() == s)
    }

    /// Whether the component takes a run (Running or Paused).
    pub fn in_run(self) -> bool {
        matches!(self, State::Running | State::Paused)
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in State::ALL {
            assert_eq!(State::parse(s.name()), Some(s));
            assert_eq!(s.to_string(), s.name());
        }
        assert_eq!(State::parse("running"), None);
    }
}
