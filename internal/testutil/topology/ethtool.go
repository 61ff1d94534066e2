package topology

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolSTXCSUM is the legacy ethtool command that sets TX checksum
// offload.
const ethtoolSTXCSUM = 0x17

// SetTxChecksumOffload turns TX checksum offload of dev on or off, in the
// calling thread's network namespace (call it inside NS.Do), with the
// legacy ethtool ioctl, so no ethtool binary is needed. Off makes a veth
// send complete checksums, as packets arriving from a wire have: native XDP
// drops the "checksum still to do" state a local sender leaves on a veth.
func SetTxChecksumOffload(dev string, on bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	val := struct{ cmd, data uint32 }{ethtoolSTXCSUM, 0}
	if on {
		val.data = 1
	}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:], dev)
	ifr.data = unsafe.Pointer(&val)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return fmt.Errorf("set tx checksum offload of %s to %v: %w", dev, on, errno)
	}
	return nil
}
