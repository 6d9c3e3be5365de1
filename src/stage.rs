//! The daemon's stages, named once: the supervisor starts them in [`Stage::ALL`] order, `/healthz`
//! and `minibatchd_stage_up` report them, the metrics label their series with [`Stage::name`].

/// A supervised stage of the daemon, in start order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Readahead: has the bytes of requested chunks read ahead (kernel readahead for a file, a
    /// fetch into the object cache for an object) before the parsers need them.
    Readahead,
    /// Parser pool: a thread per core parsing chunks.
    Parsers,
    /// Chunk cache: moves parsed chunks into the shared cache.
    Cache,
    /// Delivery: the producer pool that fills the sessions' rings.
    Delivery,
    /// Session manager: the control socket.
    Sessions,
}

impl Stage {
    /// Number of stages.
    pub const COUNT: usize = 5;

    /// All stages in start order.
    pub const ALL: [Stage; Self::COUNT] =
        [Stage::Readahead, Stage::Parsers, Stage::Cache, Stage::Delivery, Stage::Sessions];

    /// Position in [`Stage::ALL`].
    #[must_use]
    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable name: the `stage` label of metrics, logs and `/healthz`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Readahead => "readahead",
            Self::Parsers => "parsers",
            Self::Cache => "cache",
            Self::Delivery => "delivery",
            Self::Sessions => "sessions",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_and_the_indices_agree() {
        for (i, s) in Stage::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
        let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["readahead", "parsers", "cache", "delivery", "sessions"]);
    }
}
