//! Passing a ring's memfd over the control socket: `SCM_RIGHTS` ancillary data attached to the
//! bytes of the `opened` frame. The kernel duplicates the descriptor into the receiver.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// Sends `bytes` on `socket` with `fd` attached. Returns how many bytes were sent (the fd
/// travels with the first byte; the caller sends any rest with plain writes).
///
/// # Errors
/// The socket's error (`WouldBlock` on a non-blocking socket that is full).
pub fn send_with_fd(socket: BorrowedFd<'_>, bytes: &[u8], fd: BorrowedFd<'_>) -> std::io::Result<usize> {
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("ancillary buffer too small"));
    }
    Ok(rustix::net::sendmsg(socket, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL)?)
}

/// Receives into `buf` from `socket`, returning the byte count and the first descriptor that
/// came along (extra descriptors are closed).
///
/// # Errors
/// The socket's error.
pub fn recv_with_fd(socket: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(socket, &mut [IoSliceMut::new(buf)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut received = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for fd in fds {
                if received.is_none() {
                    received = Some(fd);
                }
            }
        }
    }
    Ok((msg.bytes, received))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemfdMemory, ReadOnlyMapping, SlotMemory};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_memfd_travels_and_maps_on_the_other_side() {
        let (a, b) = UnixStream::pair().expect("pair");
        let mut m = MemfdMemory::create("fdpass", 4096).expect("memfd");
        m.bytes_mut()[7] = 99;
        let sent = send_with_fd(a.as_fd(), b"hello", m.fd()).expect("send");
        assert_eq!(sent, 5);
        let mut buf = [0u8; 16];
        let (n, fd) = recv_with_fd(b.as_fd(), &mut buf).expect("recv");
        assert_eq!(&buf[..n], b"hello");
        let ro = ReadOnlyMapping::map(fd.expect("an fd came along"), 4096).expect("map");
        assert_eq!(ro.bytes()[7], 99);
    }
}
