//! A seat's memory: the node's own store of it ([`store`]), the changelog
//! that carries it to the seat's next holder ([`changelog`]), and reads
//! answered by the seat's holder ([`memread`]).

pub mod changelog;
pub mod memread;
pub mod store;

pub use store::{
    Applied, CarriedRow, DiaryNote, Episode, MemoryStore, SeatMemory, Table, take_carried_vector,
};
