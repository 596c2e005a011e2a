//! A device held in memory. Writes are durable at once; `flush` is a no-op.

use std::sync::Mutex;

use super::{check_range, Device, DeviceError, DeviceOp};

pub struct MemoryDevice {
    bytes: Mutex<Vec<u8>>,
    /// What `write_unit_bytes` reports (512 unless told otherwise).
    write_unit: u64,
}

impl MemoryDevice {
    /// A zero-filled device of `size_bytes`.
    pub fn new(size_bytes: u64) -> MemoryDevice {
        MemoryDevice::from_vec(vec![0; size_bytes as usize])
    }

    /// A device whose contents are `bytes` (for example a crash image).
    pub fn from_vec(bytes: Vec<u8>) -> MemoryDevice {
        MemoryDevice {
            bytes: Mutex::new(bytes),
            write_unit: 512,
        }
    }

    /// Reports `unit` as its preferred write unit, as a drive with larger
    /// physical than logical sectors does (what a wrapper forwards).
    pub fn with_write_unit(mut self, unit: u64) -> MemoryDevice {
        assert!(unit.is_power_of_two() && unit >= 512, "write unit {unit}");
        self.write_unit = unit;
        self
    }

    /// A copy of the whole device.
    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }
}

impl Device for MemoryDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        let bytes = self.bytes.lock().unwrap();
        check_range(DeviceOp::Read, offset, buf.len(), bytes.len() as u64)?;
        let start = offset as usize;
        buf.copy_from_slice(&bytes[start..start + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        let mut bytes = self.bytes.lock().unwrap();
        check_range(DeviceOp::Write, offset, buf.len(), bytes.len() as u64)?;
        let start = offset as usize;
        bytes[start..start + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn resize(&self, bytes: u64) -> Result<bool, DeviceError> {
        self.bytes.lock().unwrap().resize(bytes as usize, 0);
        Ok(true)
    }

    fn size_bytes(&self) -> u64 {
        self.bytes.lock().unwrap().len() as u64
    }

    fn write_unit_bytes(&self) -> u64 {
        self.write_unit
    }

    /// Zeroes the range, as a discarded range may read.
    fn discard(&self, offset: u64, len: u64) -> Result<bool, DeviceError> {
        let mut bytes = self.bytes.lock().unwrap();
        check_range(DeviceOp::Discard, offset, len as usize, bytes.len() as u64)?;
        bytes[offset as usize..(offset + len) as usize].fill(0);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read_and_bounds() {
        let dev = MemoryDevice::new(8192);
        dev.write_at(b"hello", 4094).unwrap();
        let mut buf = [0u8; 5];
        dev.read_at(&mut buf, 4094).unwrap();
        assert_eq!(&buf, b"hello");
        assert!(matches!(
            dev.write_at(b"x", 8192),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(dev.read_at(&mut buf, 8190).is_err());
    }
}
