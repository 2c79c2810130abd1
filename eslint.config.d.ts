/** Types of eslint.config.js, for the test that shows its public-interfaces rule firing. */
export declare const publicInterfacesOnly: { selector: string; message: string }[];
declare const config: unknown;
export default config;
