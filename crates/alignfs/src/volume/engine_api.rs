//! The engine as a profile's policy and workers see it ([`EngineApi`]): each operation
//! answered by the engine's parts or by the data path. It sits above both, so that
//! neither imports the other to serve a policy.

use std::sync::Arc;

use super::engine::Engine;
use super::migrate;
use crate::error::Result;
use crate::geometry::Geometry;
use crate::map::SsdBlock;
use crate::meta::{Ino, Inode, MetaState, Op};
use crate::profile::EngineApi;
use crate::stats::Counter;

impl EngineApi for Engine {
    fn geometry(&self) -> Geometry {
        self.geometry
    }
    fn meta(&self) -> &MetaState {
        &self.meta
    }
    fn counters(&self) -> Vec<u64> {
        Engine::counters(self)
    }
    fn shutting_down(&self) -> bool {
        Engine::shutting_down(self)
    }
    fn writes_so_far(&self) -> u64 {
        Engine::writes_so_far(self)
    }
    fn ssd_count(&self) -> usize {
        self.blocks.ssd_count()
    }
    fn ssd_busy(&self, member: usize) -> bool {
        self.blocks.busy(member)
    }
    fn ssd_of(&self, block: SsdBlock) -> usize {
        self.blocks.member_of(block.0 * self.geometry.block())
    }
    fn merge_batch(&self) -> usize {
        migrate::blocks_per_merge(self)
    }
    fn merge_blocks(&self, blocks: Vec<(Arc<Inode>, u64)>, cause: Counter) -> Result<(u64, Vec<(Ino, u64)>)> {
        migrate::merge_blocks_watched(self, blocks, cause)
    }
    fn merge_file_locked(&self, inode: &Arc<Inode>, cause: Counter) -> Result<()> {
        migrate::merge_file_locked(self, inode, cause)
    }
    fn drain_residue(&self, cause: Counter) -> Result<u64> {
        migrate::drain(self, cause)
    }
    fn commit(&self, ops: &[Op]) -> Result<()> {
        let freed = Engine::commit(self, ops)?;
        self.release_freed(freed);
        Ok(())
    }
}
