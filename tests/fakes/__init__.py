"""Loopback fakes of outside services, for tests that drive the real client libraries."""
