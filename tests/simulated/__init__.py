"""End to end on simulated hosts: real servers and agents over fixture sysfs trees and fake
vendor tools, never this machine's devices, so ./dev test runs them beside the device tests."""
