//! The small tier: blocks pinned once at start and kept for the pool's life.
//! One list serves reads; two write lists alternate: the active one hands out
//! blocks until it runs out, then it is sealed (its blocks are being written
//! out as a batch) and the other takes over; a sealed list returns to service
//! once every block it handed out has come back.

use crate::mem::AlignedMem;

#[derive(Debug)]
pub(crate) struct SmallList {
    pub mem: AlignedMem,
    pub slot: Option<u16>,
    pub block_size_bytes: usize,
    pub block_count: u32,
    free: Vec<u32>,
}

impl SmallList {
    pub fn new(block_size_bytes: usize, block_count: u32) -> Self {
        SmallList {
            mem: AlignedMem::new(block_size_bytes * block_count as usize),
            slot: None,
            block_size_bytes,
            block_count,
            // Reverse so that pop() hands out block 0 first.
            free: (0..block_count).rev().collect(),
        }
    }

    pub fn ptr_of(&self, index: u32) -> *mut u8 {
        assert!(index < self.block_count);
        // SAFETY: index < block_count, so the offset stays inside `mem`.
        unsafe {
            self.mem
                .as_ptr()
                .add(index as usize * self.block_size_bytes)
        }
    }

    fn is_drained(&self) -> bool {
        self.free.len() == self.block_count as usize
    }
}

/// Which list a small block came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListId {
    Read,
    Write(usize),
}

#[derive(Debug)]
pub(crate) struct SmallTier {
    pub read: SmallList,
    pub write: [SmallList; 2],
    active_write: usize,
    sealed: [bool; 2],
}

impl SmallTier {
    pub fn new(block_size_bytes: usize, read_blocks: u32, write_blocks_per_list: u32) -> Self {
        SmallTier {
            read: SmallList::new(block_size_bytes, read_blocks),
            write: [
                SmallList::new(block_size_bytes, write_blocks_per_list),
                SmallList::new(block_size_bytes, write_blocks_per_list),
            ],
            active_write: 0,
            sealed: [false; 2],
        }
    }

    pub fn pinned_bytes(&self) -> usize {
        self.read.mem.len() + self.write[0].mem.len() + self.write[1].mem.len()
    }

    pub fn list(&self, id: ListId) -> &SmallList {
        match id {
            ListId::Read => &self.read,
            ListId::Write(i) => &self.write[i],
        }
    }

    pub fn alloc_read(&mut self) -> Option<(ListId, u32)> {
        self.read.free.pop().map(|i| (ListId::Read, i))
    }

    pub fn alloc_write(&mut self) -> Option<(ListId, u32)> {
        let a = self.active_write;
        if let Some(i) = self.write[a].free.pop() {
            return Some((ListId::Write(a), i));
        }
        // The active list is full: seal it and switch, if the other is back.
        self.sealed[a] = true;
        let b = 1 - a;
        if self.sealed[b] {
            return None;
        }
        self.active_write = b;
        self.write[b].free.pop().map(|i| (ListId::Write(b), i))
    }

    pub fn free(&mut self, id: ListId, index: u32) {
        let list = match id {
            ListId::Read => &mut self.read,
            ListId::Write(i) => &mut self.write[i],
        };
        assert!(index < list.block_count, "small block index out of range");
        debug_assert!(!list.free.contains(&index), "small block freed twice");
        list.free.push(index);
        if let ListId::Write(i) = id {
            if self.sealed[i] && self.write[i].is_drained() {
                self.sealed[i] = false;
            }
        }
    }

    pub fn active_write_list(&self) -> usize {
        self.active_write
    }

    pub fn blocks_in_use(&self) -> usize {
        [&self.read, &self.write[0], &self.write[1]]
            .iter()
            .map(|l| l.block_count as usize - l.free.len())
            .sum()
    }
}
