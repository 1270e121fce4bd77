"""Test doubles shared by the suites: real servers on loopback, never mocks of our own code."""
