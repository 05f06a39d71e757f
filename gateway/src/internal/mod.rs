//! The internal runner API (a separate listener reachable only from runner processes).
