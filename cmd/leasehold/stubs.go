package main

func runLock(args []string) int         { return exitUsage }
func runLocks(args []string) int        { return exitUsage }
func runStatus(args []string) int       { return exitUsage }
func runForceRelease(args []string) int { return exitUsage }
