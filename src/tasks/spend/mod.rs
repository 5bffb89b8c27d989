//! Money: what a task may spend and what it spent. Everything that writes a task's spend is in
//! this room: the record's part ([`spent::TaskSpend`]), the open turn's ([`spending::Spending`],
//! with the day's ledger's hook), the caps and the day's ledger.
//!
//! - `spent`: what a task spent, as its record keeps it (finished turns, segments per tier and
//!   model, the host turn's earlier rounds).
//! - `spending`: what the open turn spends, from the stream; what of it the ledger holds.
//! - `caps`: a task's caps (the lowest of `limits`, its tier's and its call's), whether they are
//!   reached, and the day's cap.
//! - `ledger`: the day's spend on disk, shared by every gateway on the state directory.
//!
//! The usage report over stored records is `store/usage.rs`'s: it reads whole records.

pub(crate) mod caps;
pub(crate) mod ledger;
pub mod spending;
pub mod spent;
