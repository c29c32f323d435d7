package correlate

// ForgetNamespace returns what was explained in namespace ns and forgets
// it: the caller let go of the namespace (nothing else held it), and a
// namespace born later may get the same inode.
func (c *Correlator) ForgetNamespace(ns uint32) Attributed {
	var a Attributed
	if p := c.attrib[ns]; p != nil {
		a = *p
	}
	delete(c.attrib, ns)
	delete(c.kernelNow, ns)
	delete(c.rescuesFrom, ns)
	return a
}
