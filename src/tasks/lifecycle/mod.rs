//! The lifecycle: a task's one state word and the named transitions that move it.
//!
//! `turn` is what a turn is (pure: a state machine over one view of its messages and events),
//! `stream` a turn's messages assembled from the events; `record` is what is saved of a task
//! (its phase among it); `entry` is the record with what the gateway knows of the running turn
//! beside it. A task's status is derived from its phase and is written here only: the
//! record's status field is private to this room, so no other room can set one (the compiler
//! refuses it). Every move is a method on [`entry::TaskEntry`] that names the phase it moves
//! from and says whether it did.

pub(crate) mod entry;
pub(crate) mod held;
pub(crate) mod live;
pub(crate) mod phase;
pub(crate) mod record;
pub mod stream;
pub mod turn;
