package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// UpDetached builds the lab and leaves it standing after the calling
// process exits: the DNS backends run in a detached child, started as
// serveCmd (the caller's binary with its `lab serve` arguments), whose pid
// goes in the state file so Teardown can stop it.
// failStep injects a failure at a build step (a test hook).
func UpDetached(t Topology, srv ServerConfig, scenario string, serveCmd []string, failStep string) (err error) {
	if err := t.Validate(); err != nil {
		return err
	}
	st := State{Topology: t, Created: time.Now(), Scenario: scenario, Server: srv}
	if err := writeState(t.statePath(), st, true); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = Teardown(t.Prefix)
		}
	}()
	if err := build(t, failStep); err != nil {
		return err
	}
	cmd := exec.Command(serveCmd[0], serveCmd[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting DNS backends: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("DNS backends exited at start: %v", err)
		case <-deadline:
			_ = cmd.Process.Kill()
			return errors.New("DNS backends did not start within 10s")
		case <-time.After(20 * time.Millisecond):
		}
		if cur, err := ReadState(t.Prefix); err == nil && cur.ServerPID == cmd.Process.Pid {
			return nil
		}
	}
}

// Serve runs the DNS backends of the standing lab with prefix until ctx
// ends; it records its pid in the lab's state once they listen.
func Serve(ctx context.Context, prefix string) error {
	st, err := ReadState(prefix)
	if err != nil {
		return fmt.Errorf("no lab %q is up: %w", prefix, err)
	}
	s, err := startServers(st.Topology, st.Server)
	if err != nil {
		return err
	}
	defer s.close()
	st.ServerPID = os.Getpid()
	if err := writeState(st.Topology.statePath(), st, false); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
