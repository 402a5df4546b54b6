//! Sockets set up as the kernel's own bulk senders set them up, for tests of what a
//! receiver makes of offloaded traffic.

use std::os::fd::AsFd;

/// Turns on UDP GSO (`UDP_SEGMENT`) for `socket`: each datagram it sends of more than
/// `size` payload bytes crosses the stack (and a veth) as one super-packet, cut into
/// `size`-byte segments only where a device needs it.
pub fn set_udp_segment(socket: &std::net::UdpSocket, size: u16) -> std::io::Result<()> {
    crate::sys::set_udp_segment(socket.as_fd(), size)
}
