// Package ksym turns kernel text addresses (a kfree_skb location) into
// "function+0xoff" using /proc/kallsyms. It reads the file once, keeps only
// text symbols, and answers by binary search.
package ksym
